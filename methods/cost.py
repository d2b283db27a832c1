"""What one example of a request costs, in forward rows (forward+backward counted as one).

Each method states its cost on its registry entry (``register(cost=...)``); without one it is
derived from the params model: ``n_steps`` points along a path, else ``n_samples`` samples,
else one row. The rules shared by several methods live here; a method's own rule lives in its
module. Costs are computed from the validated params (defaults filled in) and the per-example
input shapes, before any tensor is built: the service checks them against its limits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from methods.params import MethodParams


@dataclass(frozen=True)
class CostShape:
    """What a cost depends on besides the params: the request's shapes."""

    #: per input, one example's shape (without the batch dim)
    input_shapes: tuple[tuple[int, ...], ...]
    #: rows of a baseline distribution (the *_deeplift_shap methods pair each with each example)
    n_baselines: int = 1
    return_delta: bool = False


CostFn = Callable[[Any, CostShape], int]


def one_row(p: Any, shape: CostShape) -> int:
    """One forward (and backward) per example."""
    return 1


def path_cost(p: Any, shape: CostShape) -> int:
    """``n_steps`` points along the path, plus f(inputs) and f(baselines) for the delta."""
    return int(p.n_steps) + (2 if shape.return_delta else 0)


def sampled_cost(p: Any, shape: CostShape) -> int:
    """One row per sample: ``n_samples``, the params model's default when not given."""
    return int(p.n_samples)


def baseline_pairs_cost(p: Any, shape: CostShape) -> int:
    """Each example against each baseline row: the input and the baseline, once each."""
    return 2 * max(1, shape.n_baselines)


def per_feature_cost(mask_field: str = "feature_mask") -> CostFn:
    """One perturbation per feature (group) of ``mask_field``, plus the unperturbed forward."""

    def cost(p: Any, shape: CostShape) -> int:
        return n_features(getattr(p, mask_field, None), shape) + 1

    return cost


def derived_cost(params: type[MethodParams]) -> CostFn:
    """The cost rule a params model implies when its method states none."""
    fields = params.model_fields
    if "n_steps" in fields:
        return path_cost
    if "n_samples" in fields:
        return sampled_cost
    return one_row


def n_features(mask: object, shape: CostShape) -> int:
    """Distinct feature ids in ``mask`` (a tensor or array, or one per input; an id used in
    several inputs is one feature), or every scalar of one example when there is no mask."""
    if mask is None:
        return max(1, sum(math.prod(s) for s in shape.input_shapes))
    entries: tuple[object, ...]
    if isinstance(mask, (tuple, list)) and any(
        isinstance(m, (torch.Tensor, np.ndarray, tuple, list)) for m in mask
    ):
        entries = tuple(mask)  # one mask per input
    else:
        entries = (mask,)
    ids = np.unique(np.concatenate([_ids(m) for m in entries])) if entries else np.empty(0)
    return max(1, int(ids.size))


def _ids(mask: object) -> np.ndarray:
    if isinstance(mask, torch.Tensor):
        return torch.unique(mask.detach()).cpu().numpy().reshape(-1)
    return np.unique(np.asarray(mask)).reshape(-1)
