"""Exact Shapley values over feature groups (Shapley 1953), with the baselines as "absent".

Captum averages over all F! permutations (F! x F forwards). Every permutation step is the
difference of two coalitions, so the same numbers come from evaluating each of the 2**F
coalitions once and weighting them: phi = A v (``coalitions.exact_shapley_matrix``).
"""

from __future__ import annotations

import torch

from methods.cost import n_features
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.coalitions import (
    MAX_EXACT_FEATURES,
    all_coalitions,
    evaluate,
    exact_shapley_matrix,
)
from methods.engine.masks import format_feature_mask, spread
from methods.engine.perturb import echo, start
from methods.errors import InvalidArgumentError
from methods.params import FeatureMaskParams
from methods.registry import register


class ShapleyValuesParams(FeatureMaskParams):
    pass


def working_dtype(out: torch.Tensor) -> torch.dtype:
    """Accumulate in the output's floating dtype (Captum always uses float32)."""
    return out.dtype if out.is_floating_point() else torch.get_default_dtype()


@register(
    "shapley_values",
    generation="per_output",
    family="perturbation",
    sparse_inputs=True,
    params=ShapleyValuesParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=lambda p, shape: 2 ** min(n_features(p.feature_mask, shape), 62),
    forward_only=True,
    base_values=True,
)
def shapley_values(call: Call, p: ShapleyValuesParams) -> Output:
    """Exact Shapley values of feature groups; refuses more than 16 features (2**F forwards).

    Shape: targeted output shape + input.shape[1:], as Captum.
    """
    xs = call.inputs
    masks = format_feature_mask(p.feature_mask, xs, call.method)
    f = masks.n_features
    if f > MAX_EXACT_FEATURES:
        raise InvalidArgumentError(
            f"shapley_values: the inputs have {f} features, more than the {MAX_EXACT_FEATURES} "
            f"exact Shapley values allow (2**F model evaluations); group them with "
            "feature_mask, or use shapley_value_sampling",
            argument="feature_mask",
        )
    bs = format_baselines(call.baselines, xs)
    ev, initial = start(call, xs)
    coalitions = all_coalitions(f, xs[0].device)
    values, _ = evaluate(ev, masks, coalitions.unsqueeze(1), xs, bs)
    dtype = working_dtype(initial)
    a = exact_shapley_matrix(coalitions, dtype)
    v = values.reshape(values.shape[0], -1).to(dtype)
    # Rows of A sum to zero, so subtracting v(empty) changes nothing but the rounding: a
    # feature-independent output then gets exactly zero.
    phi = (a @ (v - v[0])).reshape(f, *ev.out_shape)
    base = v[0].reshape(ev.out_shape)  # the empty coalition: the output at the baselines
    return Output(spread(phi, masks, xs, call.method), echo=echo(ev), base=base)
