"""Streaming (``methods.stream_generation``): each answer token's row as soon as it is known,
then the whole result; the rows and the result equal ``attribute_generation``'s, for every
kind of method and model, with the answer given or generated; stopping the iteration stops
the work."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import methods
from methods.errors import AttributionError
from tests.methods.test_generation import gpt2, gpt2_tokenizer, tiny_lm

PROMPT = "my friend alice lives in the city"
CASES: list[tuple[str, dict[str, Any]]] = [
    ("feature_ablation", {}),
    ("shapley_value_sampling", {"n_samples": 3, "seed": 1}),
    ("kernel_shap", {"n_samples": 24, "seed": 2}),
    ("lime", {"n_samples": 20, "seed": 2}),
    ("saliency", {}),
    ("layer_integrated_gradients", {"n_steps": 5}),
]


def split(events: list[Any]) -> tuple[list[methods.GenerationStep], methods.GenerationResult]:
    *steps, result = events
    assert all(isinstance(s, methods.GenerationStep) for s in steps)
    assert isinstance(result, methods.GenerationResult)
    return steps, result


def same(steps: list[Any], res: Any, want: Any) -> None:
    assert [s.index for s in steps] == list(range(len(want.output_ids)))
    assert [s.token_id for s in steps] == res.output_ids == want.output_ids
    assert [s.token for s in steps] == want.output_tokens
    torch.testing.assert_close(torch.stack([s.attr for s in steps]), want.token_attr)
    torch.testing.assert_close(res.token_attr, want.token_attr)
    torch.testing.assert_close(res.seq_attr, want.seq_attr)
    # equal up to rounding: the stream's forwards batch the prompts differently
    assert res.step_scores.keys() == want.step_scores.keys() and res.method == want.method
    for name, values in want.step_scores.items():
        assert res.step_scores[name] == pytest.approx(values, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("target", ["paris rome", None])
@pytest.mark.parametrize(("method", "kw"), CASES, ids=[c[0] for c in CASES])
def test_the_stream_equals_the_whole_attribution_on_gpt2(
    method: str, kw: dict[str, Any], target: str | None
) -> None:
    gen = None if target is not None else {"max_new_tokens": 3}
    args = (gpt2(), gpt2_tokenizer(), PROMPT, method)
    want = methods.attribute_generation(*args, target=target, gen_args=gen, **kw)
    steps, res = split(list(methods.stream_generation(*args, target=target, gen_args=gen, **kw)))
    same(steps, res, want)
    assert res.params["stream"] is True


@pytest.mark.parametrize("features", [["my old friend", "grace"], None])
def test_the_stream_equals_the_whole_attribution_on_tiny_lm(features: Any) -> None:
    """tiny-lm: attrserve's own key/value protocol; a template (prompts of several lengths)."""
    model, tok = tiny_lm()
    prompt = "{} {} lives in" if features else "my old friend grace lives in"
    kw = {"target": None, "gen_args": {"max_new_tokens": 2}, "features": features}
    want = methods.attribute_generation(model, tok, prompt, "shapley_values", **kw)
    steps, res = split(list(methods.stream_generation(model, tok, prompt, "shapley_values", **kw)))
    same(steps, res, want)


def test_a_plain_callable_and_a_contrast() -> None:
    """A model without a cache runs each step's prompts whole; a contrast pairs each step."""
    hf = gpt2()

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return hf(input_ids=ids).logits

    kw = {"target": "paris rome", "target_fn": "contrast", "contrast_target": "oslo lima"}
    want = methods.attribute_generation(hf, gpt2_tokenizer(), PROMPT, "feature_ablation", **kw)
    stream = methods.stream_generation(logits, gpt2_tokenizer(), PROMPT, "feature_ablation", **kw)
    steps, res = split(list(stream))
    same(steps, res, want)


def test_stopping_the_iteration_stops_the_work() -> None:
    calls = []
    hf = gpt2()

    def counted(ids: torch.Tensor) -> torch.Tensor:
        calls.append(ids.shape)
        return hf(input_ids=ids).logits

    stream = methods.stream_generation(
        counted, gpt2_tokenizer(), PROMPT, "feature_ablation", gen_args={"max_new_tokens": 20}
    )
    first = next(stream)
    assert isinstance(first, methods.GenerationStep) and first.index == 0
    after_first = len(calls)
    stream.close()
    assert len(calls) == after_first
    assert after_first <= 2  # one step: the prompts (one length: one forward), no more


@pytest.mark.parametrize(
    ("kw", "argument"),
    [
        ({"target": None, "target_fn": "contrast", "contrast_target": "oslo"}, "contrast_target"),
        ({"target": "paris", "gen_args": {"max_new_tokens": 2}}, "gen_args"),
        ({"target": None, "gen_args": {"top_k": 3}}, "gen_args"),
        ({"target": None, "gen_args": {"max_new_tokens": 500}}, "gen_args"),
        ({"method": "occlusion"}, "method"),
    ],
)
def test_mistakes_name_their_argument(kw: dict[str, Any], argument: str) -> None:
    args = {"method": "feature_ablation", **kw}
    with pytest.raises(AttributionError) as err:
        next(methods.stream_generation(gpt2(), gpt2_tokenizer(), PROMPT, **args))
    assert err.value.argument == argument
