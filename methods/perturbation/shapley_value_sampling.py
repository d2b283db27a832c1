"""Shapley value sampling: mean marginal contributions over random feature permutations.

Castro et al. 2009, https://doi.org/10.1016/j.cor.2008.04.004, in Captum's form (the baselines
stand for absent features). Every prefix of every permutation is one coalition; distinct ones
are evaluated once, all in batched forwards. Contributions along a permutation telescope, so
the attributions sum to f(inputs) - f(baselines) to the working dtype's precision.

``n_samples="auto"`` draws permutations in rounds (16, then as many again each round) until
every example's largest standard error is at most ``tolerance`` times its largest
|attribution|, or ``AUTO_MAX_SAMPLES`` permutations are drawn; every round's evaluations
count (the answer is the mean over all of them), and the answer's ``samples`` says how many.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from methods.cost import CostShape, n_features
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.coalitions import (
    contributions,
    credit_permutations,
    evaluate,
    permutation_prefixes,
    within_tolerance,
)
from methods.engine.inputs import Tensors
from methods.engine.masks import FeatureMasks, format_feature_mask, spread
from methods.engine.perturb import Evaluator, echo, start
from methods.params import PositiveInt, auto_tolerance
from methods.perturbation.shapley_values import ShapleyValuesParams, working_dtype
from methods.registry import register

#: n_samples="auto": the first round's permutations, and the most it draws
AUTO_FIRST = 16
AUTO_MAX_SAMPLES = 1024


class ShapleyValueSamplingParams(ShapleyValuesParams):
    n_samples: PositiveInt | Literal["auto"] = Field(
        25,
        description="number of random feature permutations, or 'auto': rounds of them until "
        "each example's largest standard error is at most tolerance x its largest "
        f"|attribution| (at most {AUTO_MAX_SAMPLES})",
    )
    tolerance: float = auto_tolerance()


def _samples_cost(p: ShapleyValueSamplingParams, shape: CostShape) -> int:
    n = AUTO_MAX_SAMPLES if p.n_samples == "auto" else p.n_samples
    return n * (n_features(p.feature_mask, shape) + 1)


@register(
    "shapley_value_sampling",
    generation="per_output",
    family="perturbation",
    sparse_inputs=True,
    params=ShapleyValueSamplingParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    stochastic=True,
    cost=_samples_cost,
    auto_samples=AUTO_MAX_SAMPLES,
    forward_only=True,
    # "auto" stops once every example in the call is within its tolerance
    couples_examples=lambda p: p.n_samples == "auto",
    base_values=True,
)
def shapley_value_sampling(call: Call, p: ShapleyValueSamplingParams) -> Output:
    """Shapley values estimated from n_samples random permutations of the features.

    Shape: targeted output shape + input.shape[1:], as Captum.
    """
    xs = call.inputs
    masks = format_feature_mask(p.feature_mask, xs, call.method)
    bs = format_baselines(call.baselines, xs)
    ev, initial = start(call, xs)
    dtype = working_dtype(initial)
    if p.n_samples == "auto":
        return _auto(call, p, ev, masks, bs, dtype)
    perms, values = _draw(call, ev, masks, bs, p.n_samples, dtype)
    phi = credit_permutations(perms, values)
    base = values[0, 0]  # every permutation's first prefix: the output at the baselines
    # the mean's standard error over the permutations (0 from a single one: unknown)
    spread_ = contributions(perms, values).std(0) if p.n_samples > 1 else torch.zeros_like(phi)
    error = spread(spread_ / p.n_samples**0.5, masks, xs, call.method)
    return Output(
        spread(phi, masks, xs, call.method), echo=echo(ev), base=base, standard_error=error
    )


def _draw(
    call: Call, ev: Evaluator, masks: FeatureMasks, bs: Tensors, n: int, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``n`` random permutations (n, F) and the outputs along them (n, F + 1, *out)."""
    xs, f = call.inputs, masks.n_features
    like = torch.empty(0, device=xs[0].device)
    perms = torch.argsort(call.rand((n, f), like), dim=1)
    prefixes = permutation_prefixes(perms)  # (S, F + 1, F)
    values, _ = evaluate(ev, masks, prefixes.reshape(-1, 1, f), xs, bs)
    return perms, values.to(dtype).reshape(n, f + 1, *ev.out_shape)


def _auto(
    call: Call,
    p: ShapleyValueSamplingParams,
    ev: Evaluator,
    masks: FeatureMasks,
    bs: Tensors,
    dtype: torch.dtype,
) -> Output:
    """Rounds of permutations until each example's largest standard error is within
    ``tolerance`` of its largest |attribution| (the running sums of the contributions and of
    their squares give the mean and the spread)."""
    f = masks.n_features
    total = squares = None
    n = evaluations = 0
    base = None
    while True:
        more = AUTO_FIRST if n == 0 else min(n, AUTO_MAX_SAMPLES - n)
        perms, values = _draw(call, ev, masks, bs, more, dtype)
        c = contributions(perms, values)  # (S, F, *out)
        total = c.sum(0) if total is None else total + c.sum(0)
        squares = (c * c).sum(0) if squares is None else squares + (c * c).sum(0)
        base = values[0, 0] if base is None else base
        n += more
        evaluations += more * (f + 1)
        phi = total / n
        var = (squares - n * phi * phi).clamp(min=0) / max(1, n - 1)
        se = (var / n).sqrt()
        if n >= AUTO_MAX_SAMPLES or within_tolerance(phi, se, p.tolerance):
            break
    samples = {"n_samples": n, "evaluations": evaluations}
    return Output(
        spread(phi, masks, call.inputs, call.method),
        echo={**echo(ev), "samples": samples},
        base=base,
        standard_error=spread(se, masks, call.inputs, call.method),
    )
