"""What is attributed of a generated answer (``target_fn``): probability, logit, entropy and
the contrast with an alternative answer, against inseq 0.7.1 (its step functions
``probability``, ``logit``, ``entropy``, ``contrast_prob_diff``, ``contrast_logits_diff``) for
the gradient methods, and against plain forwards of every ablated prompt for the perturbation
methods; the score table against inseq's step scores."""

from __future__ import annotations

import copy
import functools
import warnings
from typing import Any

import pytest
import torch

import methods
from methods.errors import AttributionError
from tests.methods.test_generation import gpt2, gpt2_tokenizer

PROMPT = "my friend alice lives in the city"
TARGET, CONTRAST = "paris rome", "oslo lima"
#: our target_fn (and its params) and inseq's step function (and its arguments)
CASES: list[tuple[dict[str, Any], str, dict[str, Any]]] = [
    ({"target_fn": "prob"}, "probability", {}),
    ({"target_fn": "logit"}, "logit", {}),
    ({"target_fn": "entropy"}, "entropy", {}),
    (
        {"target_fn": "contrast", "contrast_target": CONTRAST, "contrast_fn": "prob"},
        "contrast_prob_diff",
        {"contrast_targets": f"{PROMPT} {CONTRAST}"},
    ),
    (
        {"target_fn": "contrast", "contrast_target": CONTRAST, "contrast_fn": "logit"},
        "contrast_logits_diff",
        {"contrast_targets": f"{PROMPT} {CONTRAST}"},
    ),
    # contrasts of another length: paired from the end, as inseq pairs them by default
    (
        {"target_fn": "contrast", "contrast_target": "oslo", "contrast_fn": "prob"},
        "contrast_prob_diff",
        {"contrast_targets": f"{PROMPT} oslo"},
    ),
    (
        {"target_fn": "contrast", "contrast_target": "oslo lima rome", "contrast_fn": "logit"},
        "contrast_logits_diff",
        {"contrast_targets": f"{PROMPT} oslo lima rome"},
    ),
]


@functools.cache
def model() -> Any:
    """The test GPT-2 in float32, as inseq runs it (a copy: ``gpt2()`` is shared, in float64)."""
    return copy.deepcopy(gpt2()).float()


def inseq_rows(method: str, fn: str, extra: dict[str, Any]) -> tuple[torch.Tensor, Any]:
    """inseq's attributions of each answer step to the prompt's tokens ([T, prompt]), summed
    over the embedding dim as Captum and we sum them, and its step scores."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import inseq  # the oracle (make install-dev), imported where used: 3 s of imports

        m = inseq.load_model(model(), method, tokenizer=gpt2_tokenizer())
        out = m.attribute(PROMPT, f"{PROMPT} {TARGET}", attributed_fn=fn, show_progress=False,
                          step_scores=["probability", "entropy"], **extra)  # fmt: skip
    seq = out.sequence_attributions[0]
    prompt_len = len(gpt2_tokenizer()(PROMPT)["input_ids"])
    return seq.target_attributions.sum(-1)[:prompt_len].T, seq.step_scores


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient"])
@pytest.mark.parametrize(
    ("ours", "fn", "extra"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_gradient_methods_equal_inseq_s_step_functions(
    method: str, ours: dict[str, Any], fn: str, extra: dict[str, Any]
) -> None:
    theirs, steps = inseq_rows(method, fn, extra)
    res = methods.attribute_generation(model(), gpt2_tokenizer(), PROMPT, method, target=TARGET,
                                       **ours)  # fmt: skip
    assert res.target_fn == ours["target_fn"] and res.params["target_fn"] == ours["target_fn"]
    assert float(theirs.abs().max()) > 0
    torch.testing.assert_close(res.token_attr, theirs, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(torch.tensor(res.step_scores["probability"]),
                               steps["probability"], rtol=1e-5, atol=1e-7)  # fmt: skip
    torch.testing.assert_close(torch.tensor(res.step_scores["entropy"]), steps["entropy"],
                               rtol=1e-5, atol=1e-6)  # fmt: skip


def _steps(prompt_ids: list[int], target: list[int], ours: dict[str, Any]) -> torch.Tensor:
    """The attributed value of each step after ``prompt_ids``, from one plain forward."""
    m = model()
    ids = torch.tensor([prompt_ids + target])
    with torch.no_grad():
        logits = m(ids).logits[0, len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(target)]
    logp = torch.log_softmax(logits, -1)
    pick = torch.arange(len(target))

    def value(fn: str, answer: list[int]) -> torch.Tensor:
        a = torch.tensor(answer)
        return {"prob": logp.exp()[pick, a], "logit": logits[pick, a],
                "log_prob": logp[pick, a],
                "entropy": -(logp.exp() * logp).sum(-1)}[fn]  # fmt: skip

    if ours["target_fn"] == "contrast":
        tok = gpt2_tokenizer()
        contrast = tok(ours["contrast_target"], add_special_tokens=False)["input_ids"]
        # paired from the end of prompt + contrast (the unperturbed prompt's), as inseq pairs
        paired = [*tok(PROMPT)["input_ids"], *contrast][-len(target) :]
        return value(ours["contrast_fn"], target) - value(ours["contrast_fn"], paired)
    return value(ours["target_fn"], target)


@pytest.mark.parametrize(
    ("ours", "fn", "extra"), CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)]
)
def test_feature_ablation_equals_plain_forwards_of_each_ablated_prompt(
    ours: dict[str, Any], fn: str, extra: dict[str, Any]
) -> None:
    tok = gpt2_tokenizer()
    res = methods.attribute_generation(model(), tok, PROMPT, "feature_ablation", target=TARGET,
                                       baselines="<unk>", **ours)  # fmt: skip
    prompt = tok(PROMPT)["input_ids"]
    target = tok(TARGET, add_special_tokens=False)["input_ids"]
    full = _steps(prompt, target, ours)
    torch.testing.assert_close(res.output_scores, full, rtol=1e-5, atol=1e-6)
    unk = tok.convert_tokens_to_ids("<unk>")
    for i in range(len(prompt)):
        ablated = [*prompt[:i], unk, *prompt[i + 1 :]]
        want = full - _steps(ablated, target, ours)
        torch.testing.assert_close(res.token_attr[:, i], want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(res.seq_attr, res.token_attr.sum(0), rtol=1e-5, atol=1e-6)


def test_target_fn_mistakes_name_their_argument() -> None:
    tok = gpt2_tokenizer()

    def run(**kw: Any) -> Any:
        return methods.attribute_generation(model(), tok, PROMPT, "feature_ablation",
                                            target=TARGET, **kw)  # fmt: skip

    for kw, argument in [
        ({"target_fn": "surprise"}, "target_fn"),
        ({"target_fn": "contrast"}, "contrast_target"),
        ({"contrast_target": CONTRAST}, "contrast_target"),
        ({"target_fn": "contrast", "contrast_target": ""}, "contrast_target"),
        ({"target_fn": "contrast", "contrast_target": CONTRAST, "contrast_fn": "x"},
         "contrast_fn"),
    ]:  # fmt: skip
        with pytest.raises(AttributionError) as info:
            run(**kw)
        assert info.value.argument == argument, kw


def test_rank_counts_from_zero_and_a_greedy_answer_ranks_first_at_every_step() -> None:
    """CONTRACT 8.3: rank 0 is the most likely token; a greedily generated answer is, at each
    of its steps, the most likely token."""
    res = methods.attribute_generation(
        model(), gpt2_tokenizer(), PROMPT, "feature_ablation",
        gen_args={"max_new_tokens": 4, "do_sample": False},
    )  # fmt: skip
    assert res.step_scores["rank"] == [0] * len(res.output_ids)
    given = methods.attribute_generation(model(), gpt2_tokenizer(), PROMPT, target=TARGET)
    assert all(isinstance(r, int) and r >= 0 for r in given.step_scores["rank"])
