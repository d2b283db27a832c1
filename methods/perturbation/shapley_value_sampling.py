"""Shapley value sampling: mean marginal contributions over random feature permutations.

Castro et al. 2009, https://doi.org/10.1016/j.cor.2008.04.004, in Captum's form (the baselines
stand for absent features). Every prefix of every permutation is one coalition; distinct ones
are evaluated once, all in batched forwards. Contributions along a permutation telescope, so
the attributions sum to f(inputs) - f(baselines) to the working dtype's precision.
"""

from __future__ import annotations

import torch
from pydantic import Field

from methods.cost import n_features
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.coalitions import (
    contributions,
    credit_permutations,
    evaluate,
    permutation_prefixes,
)
from methods.engine.masks import format_feature_mask, spread
from methods.engine.perturb import echo, start
from methods.perturbation.shapley_values import ShapleyValuesParams, working_dtype
from methods.registry import register


class ShapleyValueSamplingParams(ShapleyValuesParams):
    n_samples: int = Field(25, gt=0, description="number of random feature permutations")


@register(
    "shapley_value_sampling",
    generation="per_output",
    family="perturbation",
    sparse_inputs=True,
    params=ShapleyValueSamplingParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    stochastic=True,
    cost=lambda p, shape: p.n_samples * (n_features(p.feature_mask, shape) + 1),
    forward_only=True,
    base_values=True,
)
def shapley_value_sampling(call: Call, p: ShapleyValueSamplingParams) -> Output:
    """Shapley values estimated from n_samples random permutations of the features.

    Shape: targeted output shape + input.shape[1:], as Captum.
    """
    xs = call.inputs
    masks = format_feature_mask(p.feature_mask, xs, call.method)
    f = masks.n_features
    bs = format_baselines(call.baselines, xs)
    ev, initial = start(call, xs)
    like = torch.empty(0, device=xs[0].device)
    perms = torch.argsort(call.rand((p.n_samples, f), like), dim=1)
    prefixes = permutation_prefixes(perms)  # (S, F + 1, F)
    values, _ = evaluate(ev, masks, prefixes.reshape(-1, 1, f), xs, bs)
    values = values.to(working_dtype(initial)).reshape(p.n_samples, f + 1, *ev.out_shape)
    phi = credit_permutations(perms, values)
    base = values[0, 0]  # every permutation's first prefix: the output at the baselines
    # the mean's standard error over the permutations (0 from a single one: unknown)
    spread_ = contributions(perms, values).std(0) if p.n_samples > 1 else torch.zeros_like(phi)
    error = spread(spread_ / p.n_samples**0.5, masks, xs, call.method)
    return Output(
        spread(phi, masks, xs, call.method), echo=echo(ev), base=base, standard_error=error
    )
