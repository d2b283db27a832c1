"""methods.attribute_generation: Captum 0.9.0's LLMAttribution / LLMGradientAttribution numbers
on a tiny GPT-2 (built from a config, tokenizer built offline), the batched and cached scoring
equal to one plain forward per prompt, tiny-lm's ground truth, typed errors, the caller's model
left as it was."""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import methods
import model_registry
from methods.generation import (
    EmptyPromptError,
    EmptyTargetError,
    TargetTooLongError,
    TemplateMismatchError,
    UnsupportedGenerationMethodError,
)
from methods.generation import scorer as scorer_module
from methods.generation.lm import wrap
from methods.generation.scorer import Scorer
from model_registry.builtin import lm as tiny

captum_attr = pytest.importorskip("captum.attr")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = [
    "<unk>", "<bos>", "<eos>", "<pad>", "the", "a", "of", "in", "to", "and", "is", "was", "lives",
    "city", "alice", "bob", "carol", "dave", "paris", "rome", "oslo", "lima", "my", "friend",
    "old", "young", "from", "near", "who", "said", "that",
]  # fmt: skip

TEMPLATE = "my friend {} lives in {} near {}"
VALUES = ["alice", "the city", "bob"]
BASELINES = ["", "a", "carol"]
TARGET = "paris rome"


@functools.cache
def gpt2_tokenizer() -> Any:
    tk = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
    )
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
    )


@functools.cache
def gpt2() -> Any:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=len(WORDS), n_positions=64, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=1, eos_token_id=2, pad_token_id=3,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).double().eval()


@functools.cache
def tiny_lm() -> tuple[Any, Any]:
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tiny-lm"]
    loaded = model_registry.load(spec)
    return loaded.model, loaded.text_tokenizer


def template_input() -> Any:
    return captum_attr.TextTemplateInput(TEMPLATE, values=VALUES, baselines=BASELINES)


def token_input() -> Any:
    return captum_attr.TextTokenInput(
        "my friend alice lives in the city", gpt2_tokenizer(), baselines="<unk>",
        skip_tokens=["<bos>"],
    )  # fmt: skip


def ours_template(method: str, **kw: Any) -> methods.GenerationResult:
    return methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), TEMPLATE, method, target=TARGET, features=VALUES,
        baselines=BASELINES, **kw,
    )  # fmt: skip


def ours_tokens(method: str, **kw: Any) -> methods.GenerationResult:
    return methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), "my friend alice lives in the city", method, target=TARGET,
        baselines="<unk>", skip_tokens=["<bos>"], **kw,
    )  # fmt: skip


def captum(cls: Any, inp: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor | None, Any]:
    """Captum's result, with the wrapped method's raw (working dtype) output caught on its way:
    LLMAttribution accumulates into float32. ``use_cached_outputs=False``: under transformers
    5 Captum's cached token-by-token path feeds the whole sequence again on top of its cache,
    so every target token after the first gets a wrong log-probability (README)."""
    llm = captum_attr.LLMAttribution(cls(gpt2()), gpt2_tokenizer())
    raw: list[torch.Tensor] = []
    inner = llm.attr_method.attribute

    def spy(*a: Any, **k: Any) -> Any:
        raw.append(inner(*a, **k))
        return raw[-1]

    llm.attr_method.attribute = spy
    res = llm.attribute(inp, target=TARGET, use_cached_outputs=False, **kw)
    rows = raw[0].reshape(-1, inp.n_itp_features)
    return rows[0], (rows[1:] if rows.shape[0] > 1 else None), res


def close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float) -> None:
    torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=atol)


# -- parity with Captum ------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["template", "tokens"])
def test_feature_ablation_equals_captum(form: str) -> None:
    inp = template_input() if form == "template" else token_input()
    seq, tok, res = captum(captum_attr.FeatureAblation, inp)
    ours = (
        ours_template("feature_ablation") if form == "template" else ours_tokens("feature_ablation")
    )
    close(ours.seq_attr, seq, 1e-10, 1e-12)
    assert tok is not None
    close(ours.token_attr, tok, 1e-10, 1e-12)
    assert ours.input_tokens == list(res.input_tokens)
    assert ours.output_tokens == list(res.output_tokens) == ["paris", "rome"]


def test_shapley_values_exact_equal_captum() -> None:
    seq, tok, _ = captum(captum_attr.ShapleyValues, template_input())
    ours = ours_template("shapley_values")
    # Captum's Shapley values accumulate in float32
    close(ours.seq_attr, seq, 1e-5, 1e-6)
    assert tok is not None
    close(ours.token_attr, tok, 1e-5, 1e-6)


def test_shapley_value_sampling_equals_captum_with_the_same_permutations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from captum.attr._core import shapley_value

    seed, n_samples, f = 3, 4, len(VALUES)
    # the engine draws its permutations as argsort(rand(n_samples, F)) from the seeded generator
    g = torch.Generator().manual_seed(seed)
    perms = torch.argsort(torch.rand((n_samples, f), generator=g), dim=1)

    def same(num_features: int, num_samples: int) -> Iterator[list[int]]:
        yield from perms.tolist()

    monkeypatch.setattr(shapley_value, "_perm_generator", same)
    seq, tok, _ = captum(captum_attr.ShapleyValueSampling, template_input(), n_samples=n_samples)
    ours = ours_template("shapley_value_sampling", n_samples=n_samples, seed=seed)
    close(ours.seq_attr, seq, 1e-5, 1e-6)
    assert tok is not None
    close(ours.token_attr, tok, 1e-5, 1e-6)


def test_kernel_shap_over_every_coalition_equals_captum_shapley_values() -> None:
    seq, _, _ = captum(captum_attr.ShapleyValues, template_input())
    ours = ours_template("kernel_shap", n_samples=1 << len(VALUES))
    close(ours.seq_attr, seq, 1e-5, 1e-6)
    # the per-token fits over the same coalitions add up to the whole answer's
    close(ours.token_attr.sum(0), ours.seq_attr, 1e-9, 1e-10)


@pytest.mark.parametrize("method", ["kernel_shap", "lime"])
def test_fitted_methods_reproducible_under_seed(method: str) -> None:
    a = ours_template(method, n_samples=6, seed=5)
    b = ours_template(method, n_samples=6, seed=5, perturbations_per_eval=1, use_cache=False)
    close(a.seq_attr, b.seq_attr, 1e-10, 1e-12)
    close(a.token_attr, b.token_attr, 1e-10, 1e-12)
    assert a.token_attr.shape == (2, len(VALUES))


@pytest.mark.parametrize(
    ("ours_name", "captum_cls", "kw"),
    [
        ("layer_integrated_gradients", "LayerIntegratedGradients", {"n_steps": 8}),
        ("input_x_gradient", "LayerGradientXActivation", {}),
    ],
)
def test_gradient_methods_equal_captum(ours_name: str, captum_cls: str, kw: dict[str, Any]) -> None:
    m = gpt2()
    layer = getattr(captum_attr, captum_cls)(m, m.transformer.wte)
    res = captum_attr.LLMGradientAttribution(layer, gpt2_tokenizer()).attribute(
        token_input(), target=TARGET, **kw
    )
    ours = ours_tokens(ours_name, **kw)
    # Captum rounds quadrature weights through float32 (README)
    close(ours.seq_attr, res.seq_attr, 1e-6, 1e-8)
    close(ours.token_attr, res.token_attr, 1e-6, 1e-8)
    assert ours.method == (
        "layer_gradient_x_activation" if ours_name == "input_x_gradient" else ours_name
    )


def test_generated_target_equals_captums() -> None:
    gen = {"max_new_tokens": 4, "do_sample": False}
    llm = captum_attr.LLMAttribution(captum_attr.FeatureAblation(gpt2()), gpt2_tokenizer())
    res = llm.attribute(template_input(), gen_args=gen, use_cached_outputs=False)
    ours = methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), TEMPLATE, features=VALUES, baselines=BASELINES, gen_args=gen
    )
    assert ours.output_tokens == list(res.output_tokens)
    close(ours.seq_attr, res.seq_attr, 1e-6, 1e-7)


# -- batched, cached == plain -------------------------------------------------------------------


def plain_log_probs(model: Any, prompts: list[tuple[int, ...]], target: list[int]) -> torch.Tensor:
    """The literal reference: one whole forward per prompt, no batching, no cache."""
    rows = []
    with torch.no_grad():
        for q in prompts:
            ids = torch.tensor([list(q) + target])
            logp = torch.log_softmax(wrap(model).logits(ids)[0], dim=-1)
            rows.append(torch.stack([logp[len(q) - 1 + t, y] for t, y in enumerate(target)]))
    return torch.stack(rows)


@pytest.mark.parametrize("which", ["gpt2", "tiny-lm"])
@pytest.mark.parametrize("max_rows", [None, 1, 3])
def test_scorer_equals_one_plain_forward_per_prompt(which: str, max_rows: int | None) -> None:
    if which == "gpt2":
        model, tok = gpt2(), gpt2_tokenizer()
    else:
        model, tok = tiny_lm()
        model = copy.deepcopy(model).double()
    base = tok.encode("my friend alice lives in the city")
    prompts = [
        tuple(base), (*base[:3], 5, *base[4:]), tuple(base[:5]), (*base[:2], 9, 9, 9, *base[2:]),
        (*base[:1], *base[2:]), tuple(base),
    ]  # fmt: skip
    target = [4, 6, 7]
    scorer = Scorer(wrap(model), torch.tensor(target), references=[tuple(base)], max_rows=max_rows)
    got = scorer.score(prompts)
    close(got, plain_log_probs(model, prompts, target), 1e-12, 1e-12)
    assert scorer.stats.cached_tokens > 0 and scorer.stats.rows == len(set(prompts))


@pytest.mark.parametrize(
    "method", ["feature_ablation", "shapley_value_sampling", "shapley_values", "lime"]
)
def test_cached_batched_equal_plain_on_templates(method: str) -> None:
    kw: dict[str, Any] = {"seed": 1} if method in ("shapley_value_sampling", "lime") else {}
    fast = ours_template(method, **kw)
    slow = ours_template(method, use_cache=False, perturbations_per_eval=1, **kw)
    close(fast.seq_attr, slow.seq_attr, 1e-10, 1e-12)
    close(fast.token_attr, slow.token_attr, 1e-10, 1e-12)
    assert fast.stats["forwards"] < slow.stats["forwards"]


@pytest.mark.parametrize("which", ["gpt2", "tiny-lm"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_a_perturbation_runs_exactly_the_forwards_it_counts(which: str, use_cache: bool) -> None:
    """The forward that caches the unperturbed prompt also scores it, and the answer's score
    table reuses its logits: the model runs as often as ``stats["forwards"]`` says, no more."""
    if which == "gpt2":
        model, tok = gpt2(), gpt2_tokenizer()
        counted = model.transformer.wte
    else:
        model, tok = tiny_lm()
        counted = model.embed
    calls = []
    handle = counted.register_forward_hook(lambda *_: calls.append(1))
    try:
        res = methods.attribute_generation(
            model, tok, "my friend alice lives in the city", "feature_ablation",
            target=TARGET, baselines="<unk>", skip_tokens=["<bos>"], use_cache=use_cache,
        )  # fmt: skip
    finally:
        handle.remove()
    assert len(calls) == res.stats["forwards"]
    assert (res.stats["tokens_from_cache"] > 0) == use_cache
    plain = plain_log_probs(model, [tuple(tok.encode("my friend alice lives in the city"))],
                            tok.encode(TARGET, add_special_tokens=False))  # fmt: skip
    close(res.output_log_probs.double(), plain[0].double(), 1e-5, 1e-6)


def test_a_reference_is_cached_only_where_it_spares_more_than_its_forward() -> None:
    """Feature ablation shares at most one more token with the all-absent prompt than with the
    unperturbed one: caching it would cost a forward to spare a token."""
    model, tok = gpt2(), gpt2_tokenizer()
    base = tuple(tok.encode("my friend alice lives in the city"))
    absent = (base[0], *([0] * (len(base) - 1)))
    ablated = [(*base[:i], 0, *base[i + 1 :]) for i in range(1, len(base))]
    scorer = Scorer(wrap(model), torch.tensor([4, 6]), references=[base, absent])
    got = scorer.score([base, *ablated])
    close(got, plain_log_probs(model, [base, *ablated], [4, 6]), 1e-12, 1e-12)
    assert scorer.stats.cached_tokens > 0
    assert scorer.stats.rows == len(ablated) + 1  # the absent prompt was never run
    # Twenty prompts sharing all but their last token with the absent one: worth its forward.
    deep = [(*absent[:-1], k) for k in range(5, 25)]
    before = scorer.stats.cached_tokens
    close(scorer.score(deep), plain_log_probs(model, deep, [4, 6]), 1e-12, 1e-12)
    assert scorer.stats.cached_tokens - before == len(deep) * (len(absent) - 1)
    assert scorer.stats.rows == len(ablated) + 1 + len(deep) + 1  # + the absent prompt


def test_where_a_forward_costs_a_thousand_tokens_prompts_share_one_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A forward's fixed cost is counted by device type (a GPU's launches outweigh the tokens a
    shared prefix spares): at a GPU's cost, feature ablation's prompts run in one forward after
    the reference's; at a CPU's, the rows split by the depth they share. The same numbers
    either way."""
    model = gpt2()
    base = (1, *(5 + (7 * i) % (len(WORDS) - 5) for i in range(29)))  # 30 tokens
    ablated = [(*base[:i], 0, *base[i + 1 :]) for i in range(1, len(base))]
    want = plain_log_probs(model, [base, *ablated], [4, 6])
    cpu = Scorer(wrap(model), torch.tensor([4, 6]), references=[base])
    close(cpu.score([base, *ablated]), want, 1e-12, 1e-12)
    assert cpu.stats.cached_tokens > 0 and cpu.stats.forwards > 2
    monkeypatch.setitem(scorer_module.FORWARD_OVERHEAD_TOKENS, "cpu",
                        scorer_module.ACCELERATOR_OVERHEAD_TOKENS)  # fmt: skip
    gpu = Scorer(wrap(model), torch.tensor([4, 6]), references=[base])
    close(gpu.score([base, *ablated]), want, 1e-12, 1e-12)
    assert gpu.stats.forwards == 2


def test_the_output_head_gets_its_kept_positions_contiguous() -> None:
    """With grad on, a strided slice of the hidden states into the head runs as a batched
    matmul (as slow as every position); the head gets a contiguous copy, and the hook that
    makes it is gone after the call."""
    model = gpt2()
    head = model.get_output_embeddings()
    seen: list[tuple[bool, bool]] = []
    handle = head.register_forward_hook(
        lambda _m, args, _out: seen.append((args[0].is_contiguous(), torch.is_grad_enabled()))
    )
    try:
        ours_tokens("layer_integrated_gradients", n_steps=3)
    finally:
        handle.remove()
    assert any(grad for _, grad in seen) and all(c for c, grad in seen if grad)
    assert not head._forward_pre_hooks and not head._forward_hooks


def test_the_cache_goes_by_the_name_the_model_takes() -> None:
    """transformers 5.24 renamed ``past_key_values`` to ``cache``; the old name warns."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ours_tokens("feature_ablation")
    assert not [w for w in seen if "past_key_values" in str(w.message)]


# -- tiny-lm's ground truth ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["feature_ablation", "shapley_values", "kernel_shap"])
def test_tiny_lm_puts_the_city_on_the_name(method: str) -> None:
    model, tok = tiny_lm()
    model = model.float()
    for i in (1, 2, 6):  # (alice's paris is also the guess without a name: a weak case)
        name, city = tiny.NAMES[i], tiny.CITIES[tiny.FACTS[i]]
        extra: dict[str, Any] = {"n_samples": 4} if method == "kernel_shap" else {}
        res = methods.attribute_generation(
            model, tok, "{} {} lives in", method, features=["my old friend", name], **extra
        )
        assert res.output_tokens[0] == city
        assert int(res.seq_attr.argmax()) == 1
        assert res.token_attr[0, 1] > 5 * abs(float(res.token_attr[0, 0]))


def test_tiny_lm_gradient_ranks_the_name_above_the_filler() -> None:
    model, tok = tiny_lm()
    res = methods.attribute_generation(
        model.float(), tok, "my old friend grace lives in", "layer_integrated_gradients",
        target=tiny.CITIES[tiny.FACTS[6]], skip_tokens=["<bos>"], n_steps=16,
    )  # fmt: skip
    scores = dict(zip(res.input_tokens, res.seq_attr.tolist(), strict=True))
    assert scores["grace"] > max(scores["my"], scores["old"], scores["friend"])


# -- errors and the caller's model ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "error", "argument"),
    [
        ({"prompt": "   "}, EmptyPromptError, "prompt"),
        ({"prompt": "{} lives in {}", "features": ["alice"]}, TemplateMismatchError, "features"),
        ({"prompt": "{a} lives in", "features": ["alice"]}, TemplateMismatchError, "features"),
        ({"prompt": "{} lives in", "features": ["alice"], "baselines": ["a", "b"]},
         TemplateMismatchError, "baselines"),
        ({"target": "paris " * 80}, TargetTooLongError, "target"),
        ({"target": ""}, EmptyTargetError, "target"),
        ({"method": "deeplift"}, UnsupportedGenerationMethodError, "method"),
        ({"prompt": "{} lives in", "features": ["alice"], "method": "saliency"},
         UnsupportedGenerationMethodError, "method"),
        ({"gen_args": {"max_new_tokens": 2}}, methods.InvalidArgumentError, "gen_args"),
        ({"feature_mask": torch.zeros(1, 2)}, methods.InvalidArgumentError, "feature_mask"),
        ({"n_samples": 3}, methods.UnknownParameterError, None),
    ],
)  # fmt: skip
def test_bad_input_is_a_typed_error(kw: dict[str, Any], error: type, argument: str | None) -> None:
    args: dict[str, Any] = {"prompt": "my friend alice lives in", "target": "paris", **kw}
    with pytest.raises(error) as info:
        methods.attribute_generation(gpt2(), gpt2_tokenizer(), **args)
    if argument is not None:
        assert getattr(info.value, "argument", None) == argument


def test_the_callers_model_is_left_as_it_was() -> None:
    model, tok = tiny_lm()
    model = model.float()
    model.blocks[0].train()  # an odd mode, to see it kept
    model.embed.weight.requires_grad_(True)
    try:
        for method in ("layer_integrated_gradients", "saliency", "feature_ablation"):
            methods.attribute_generation(
                model, tok, "my old friend bob lives in", method, target="quito", n_steps=4
            ) if method == "layer_integrated_gradients" else methods.attribute_generation(
                model, tok, "my old friend bob lives in", method, target="quito"
            )
        assert model.embed.weight.requires_grad
        assert not model.embed.weight.grad
        assert model.blocks[0].training and not model.blocks[1].training
        for m in model.modules():
            assert not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
    finally:
        model.blocks[0].eval()
        model.embed.weight.requires_grad_(False)


@pytest.mark.parametrize("method", ["feature_ablation", "layer_integrated_gradients"])
def test_progress_counts_the_prompts_evaluated(
    capsys: pytest.CaptureFixture[str], method: str
) -> None:
    """progress=True (CONTRACT §7.7): a bar over the prompts scored or the path's steps."""
    import re

    quiet = ours_tokens(method)
    assert capsys.readouterr().err == ""
    shown = ours_tokens(method, progress=True)
    done, total = map(int, re.findall(r"(\d+)/(\d+)", capsys.readouterr().err)[-1])
    assert done == total > 1
    close(shown.seq_attr, quiet.seq_attr, rtol=0, atol=0)


@pytest.mark.parametrize("n_steps", [6, "auto"])
def test_auto_chunks_hold_no_more_than_captums_pass_per_answer_token(n_steps: Any) -> None:
    """One call runs every answer token, but an "auto" chunk holds no more rows than Captum's
    one pass for one token (n_steps; 50, its default, for "auto"), however large the memory
    budget: on a GPU half the free memory otherwise took every token's steps at once."""
    from methods.engine import batching

    batching.set_memory_budget(1 << 40)
    try:
        capped = ours_tokens("layer_integrated_gradients", n_steps=n_steps)
    finally:
        batching.set_memory_budget(None)
    # "auto" climbs 2, 3, 5, ... Clenshaw-Curtis points; a rung's new points are 1 to 256
    per_pass = 6 if n_steps == 6 else 50
    tokens = 2  # "paris rome"
    assert tokens <= capped.params["internal_batch_size"] <= max(per_pass, tokens)
    whole = ours_tokens("layer_integrated_gradients", n_steps=n_steps, internal_batch_size=None)
    close(capped.seq_attr, whole.seq_attr, rtol=1e-5, atol=1e-6)
