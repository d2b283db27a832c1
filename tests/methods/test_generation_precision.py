"""attribute_generation and stream_generation in a precision: the model's cast copy runs, the
scores come from float32 logits, the answer says what it cost (``fidelity``), a failed check
answers in float32, every precision explains the same answer, the caller's model untouched."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

import methods
from methods.engine import precision as precision_
from methods.errors import InvalidArgumentError, InvalidTypeError, UnsupportedModelError
from methods.generation import targets
from tests.methods.test_generation import gpt2, gpt2_tokenizer, tiny_lm

pytest.importorskip("transformers")

PROMPT = "my friend alice lives in the city"
KW: dict[str, Any] = {"target": "paris rome", "baselines": "<unk>", "skip_tokens": ["<bos>"]}
METHODS = ["feature_ablation", "layer_integrated_gradients", "shapley_value_sampling"]


@functools.cache
def model32() -> Any:
    return copy.deepcopy(gpt2()).float()


def run(method: str, **kw: Any) -> methods.GenerationResult:
    extra = {"n_samples": 3, "seed": 7} if method == "shapley_value_sampling" else {}
    return methods.attribute_generation(
        model32(), gpt2_tokenizer(), PROMPT, method, **{**KW, **extra, **kw}
    )


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("method", METHODS)
def test_bfloat16_is_close_to_float32_and_says_so(method: str) -> None:
    ref = run(method)
    low = run(method, precision="bfloat16")
    assert ref.fidelity is not None and ref.fidelity.precision == "float32"
    assert low.fidelity is not None and low.fidelity.precision == "bfloat16"
    assert not low.fidelity.checked and low.fidelity.delta_ratio is None
    assert low.seq_attr.dtype == torch.float32  # scores taken in float32, not bfloat16
    assert 0 < rel_l2(low.seq_attr, ref.seq_attr) < 0.05
    assert low.output_ids == ref.output_ids


@pytest.mark.parametrize("method", METHODS)
def test_verify_measures_against_float32_and_falls_back_beyond_the_tolerance(method: str) -> None:
    ref = run(method)
    ok = run(method, precision="bfloat16", verify=True)
    f = ok.fidelity
    assert f is not None and f.checked and not f.fallback and f.precision == "bfloat16"
    assert f.rel_l2 == pytest.approx(rel_l2(ok.seq_attr, ref.seq_attr), rel=1e-6)
    assert f.topk_agreement is not None and f.top_k == ref.seq_attr.numel()
    bad = run(method, precision="bfloat16", verify=True, fidelity_tolerance=1e-9)
    fb = bad.fidelity
    assert fb is not None and fb.fallback and fb.precision == "float32" and fb.tried == "bfloat16"
    assert torch.equal(bad.seq_attr, ref.seq_attr) and torch.equal(bad.token_attr, ref.token_attr)


def test_a_generated_answer_is_the_models_own_in_every_precision() -> None:
    gen = {"gen_args": {"max_new_tokens": 3}, "target": None}
    ref = run("feature_ablation", **gen)
    low = run("feature_ablation", precision="bfloat16", verify=True, **gen)
    assert low.output_ids == ref.output_ids
    assert low.params["gen_args"] == ref.params["gen_args"] == {"max_new_tokens": 3}
    assert low.fidelity is not None and low.fidelity.checked
    assert low.fidelity.rel_l2 == pytest.approx(rel_l2(low.seq_attr, ref.seq_attr), rel=1e-6)


def test_a_stochastic_method_draws_the_same_samples_in_every_precision() -> None:
    """No seed given: one is drawn for the call, so the float32 check compares like with like
    (different samples would be ~0.3 apart on this model at 3 samples)."""
    res = methods.attribute_generation(
        model32(), gpt2_tokenizer(), PROMPT, "shapley_value_sampling", n_samples=3,
        precision="bfloat16", verify=True, **KW,
    )  # fmt: skip
    assert res.fidelity is not None and res.fidelity.rel_l2 is not None
    assert res.fidelity.rel_l2 < 0.05 and isinstance(res.params["seed"], int)


def test_auto_probes_on_the_first_call_of_a_method_and_keeps_the_choice() -> None:
    model = copy.deepcopy(model32())
    first = methods.attribute_generation(
        model, gpt2_tokenizer(), PROMPT, "feature_ablation", precision="auto", **KW
    )
    again = methods.attribute_generation(
        model, gpt2_tokenizer(), PROMPT, "feature_ablation", precision="auto", **KW
    )
    assert first.fidelity is not None and again.fidelity is not None
    assert first.fidelity.checked and not again.fidelity.checked
    assert first.fidelity.chosen == again.fidelity.chosen and "kept" in str(first.fidelity.chosen)
    assert first.fidelity.precision == again.fidelity.precision
    kept = precision_.known_probe(model, ("generation", "feature_ablation"))
    assert kept is not None and kept.precision == again.fidelity.precision


def test_a_float64_model_runs_in_float32_when_asked() -> None:
    ref = methods.attribute_generation(gpt2(), gpt2_tokenizer(), PROMPT, "feature_ablation", **KW)
    res = methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), PROMPT, "feature_ablation", precision="float32", **KW
    )
    assert res.fidelity is not None and res.fidelity.precision == "float32"
    assert res.seq_attr.dtype == torch.float32 and ref.seq_attr.dtype == torch.float64
    assert 0 < rel_l2(res.seq_attr.double(), ref.seq_attr) < 1e-5
    assert ref.fidelity is not None and ref.fidelity.precision == "float64"


@pytest.mark.parametrize("method", ["feature_ablation", "layer_integrated_gradients"])
def test_a_stream_in_a_precision_equals_the_answer_in_it(method: str) -> None:
    items = list(
        methods.stream_generation(
            model32(), gpt2_tokenizer(), PROMPT, method, precision="bfloat16", **KW
        )
    )
    streamed = items[-1]
    assert isinstance(streamed, methods.GenerationResult)
    assert streamed.fidelity is not None and streamed.fidelity.precision == "bfloat16"
    whole = run(method, precision="bfloat16")
    torch.testing.assert_close(streamed.seq_attr, whole.seq_attr, rtol=1e-2, atol=1e-4)
    rows = torch.stack([s.attr for s in items[:-1]])
    torch.testing.assert_close(rows, whole.token_attr, rtol=1e-2, atol=1e-4)


def test_the_callers_model_is_left_as_it_was() -> None:
    model = copy.deepcopy(model32())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_on = methods.attribute_generation(
        model, gpt2_tokenizer(), PROMPT, "layer_integrated_gradients", precision="bfloat16",
        verify=True, **KW,
    )  # fmt: skip
    assert run_on.fidelity is not None
    after = model.state_dict()
    assert all(
        after[k].dtype == torch.float32 and torch.equal(after[k], v) for k, v in before.items()
    )
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"precision": "int8"}, InvalidArgumentError),
        ({"precision": "bfloat16", "verify": "yes"}, InvalidTypeError),
        ({"precision": "bfloat16", "fidelity_tolerance": -1}, InvalidArgumentError),
        ({"verify": True}, InvalidArgumentError),  # nothing to compare with
    ],
)
def test_bad_precision_arguments_are_typed_errors(kw: dict[str, Any], error: type) -> None:
    with pytest.raises(error) as info:
        run("feature_ablation", **kw)
    assert info.value.argument in ("precision", "verify", "fidelity_tolerance")


def test_a_model_that_is_not_a_module_cannot_be_cast() -> None:
    module = model32()

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return module(ids).logits

    with pytest.raises(UnsupportedModelError) as info:
        methods.attribute_generation(
            logits, gpt2_tokenizer(), PROMPT, "feature_ablation", precision="bfloat16", **KW
        )
    assert info.value.argument == "precision"


def test_low_precision_logits_are_scored_in_float32() -> None:
    """A softmax over bfloat16 logits in bfloat16 keeps 2-3 digits; widened, the log-probs are
    those of the (rounded) logits to float32's precision."""
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(1, 3, 50000, generator=gen) * 4).bfloat16()
    target = torch.tensor([1, 2, 3])
    got = targets.log_prob(logits, target)
    assert got.dtype == torch.float32
    exact = targets.log_prob(logits.double(), target)
    assert (got.double() - exact).abs().max() < 1e-5
    narrow = torch.log_softmax(logits, dim=-1)[0, [0, 1, 2], [1, 2, 3]]
    assert (narrow.double() - exact).abs().max() > 1e-3


@pytest.mark.parametrize("method", ["feature_ablation", "layer_integrated_gradients"])
def test_a_model_with_the_kv_protocol_runs_in_a_precision(method: str) -> None:
    """tiny-lm (``forward_cached``, not Hugging Face): its cast copy keeps the protocol."""
    model, tok = tiny_lm()
    ref = methods.attribute_generation(model, tok, "grace lives in", method, target=" paris")
    res = methods.attribute_generation(
        model, tok, "grace lives in", method, target=" paris", precision="bfloat16", verify=True
    )
    f = res.fidelity
    assert f is not None and f.checked and f.rel_l2 is not None
    assert f.rel_l2 == pytest.approx(rel_l2(res.seq_attr, ref.seq_attr), rel=1e-6, abs=1e-9)
    assert int(res.seq_attr.argmax()) == int(ref.seq_attr.argmax())  # the name, as in float32


def test_a_stream_takes_no_check() -> None:
    for name, value in (("verify", True), ("fidelity_tolerance", 0.1)):
        stream = methods.stream_generation(
            model32(), gpt2_tokenizer(), PROMPT, "feature_ablation", precision="bfloat16",
            **{name: value}, **KW,
        )  # fmt: skip
        with pytest.raises(InvalidArgumentError) as info:
            next(iter(stream))
        assert info.value.argument == name


def test_a_model_stored_in_bfloat16_keeps_its_path_in_float32_when_asked() -> None:
    """precision equal to a low dtype the model is stored in: the layer taps still hand the
    engine float32 (the path, the sums), as for a float32 model's cast copy."""
    ref = run("layer_integrated_gradients")
    stored = copy.deepcopy(model32()).bfloat16()
    plain = methods.attribute_generation(
        stored, gpt2_tokenizer(), PROMPT, "layer_integrated_gradients", **KW
    )
    asked = methods.attribute_generation(
        stored, gpt2_tokenizer(), PROMPT, "layer_integrated_gradients", precision="bfloat16",
        **KW,
    )  # fmt: skip
    assert plain.seq_attr.dtype == torch.bfloat16  # Captum's way: the model as given
    assert asked.seq_attr.dtype == torch.float32
    assert asked.fidelity is not None and asked.fidelity.precision == "bfloat16"
    assert rel_l2(asked.seq_attr, ref.seq_attr) < rel_l2(plain.seq_attr.float(), ref.seq_attr)
