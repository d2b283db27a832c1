"""Background sets: a method's answer averaged over many baselines (interventional values).

``baselines=Background(rows)`` (or ``{"background": rows}``) asks for the mean of the method's
answers with each background row as the baseline, weighted where the rows are a summary
(``weights``, as ``shap.kmeans`` gives). For Shapley values this is what shap computes with an
``Independent`` masker: the value of a coalition is the mean, over the background, of the
output with the absent features taken from the background row.

The engine computes it in one call: the batch is tiled once per background row (``Call.
expanded``: examples x rows, forward args and targets tiled with it) with the rows as the
baselines, so every method batches coalitions, steps and rows in the same forwards; the
answers are then folded back per example. A method whose random draws are shared across its
call's rows (``shapley_value_sampling``'s permutations) thereby uses the same draws for every
background row, as shap averages the value function before crediting features.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from methods.engine.baselines import reference_rows
from methods.engine.inputs import Tensors
from methods.errors import BaselineError, InvalidTypeError

#: the most background rows a call takes (shap's own warning starts at 100; a K-means summary
#: of a larger set is the tool for more)
MAX_ROWS = 4096


@dataclass(frozen=True)
class Background:
    """Reference rows standing for absent features, one tensor per input of shape
    ``(B, *example_shape)`` (a single tensor for one input); ``weights``: ``(B,)``, the
    rows' shares (None: equal), e.g. a K-means summary's cluster sizes."""

    rows: Tensor | tuple[Tensor, ...]
    weights: Tensor | None = None


def background_of(baselines: object) -> Background | None:
    """The background set ``baselines`` gives, or None for Captum's other forms."""
    if isinstance(baselines, Background):
        return baselines
    if isinstance(baselines, Mapping) and "background" in baselines:
        unknown = set(baselines) - {"background", "weights"}
        if unknown:
            raise BaselineError(
                f"a background set is {{'background': rows, 'weights': shares}}; unknown keys "
                f"{sorted(unknown)}",
                argument="baselines",
            )
        return Background(baselines["background"], baselines.get("weights"))
    return None


def formatted(bg: Background, xs: Tensors) -> tuple[Tensors, Tensor]:
    """The rows per input, on the inputs' device and dtype (shape checked), and their
    weights normalised to sum to 1."""
    rows = bg.rows if isinstance(bg.rows, (tuple, list)) else (bg.rows,)
    if len(rows) != len(xs):
        raise BaselineError(
            f"the background has {len(rows)} tensors but there are {len(xs)} inputs; give one "
            "tensor of rows per input",
            argument="baselines",
        )
    out = []
    for i, (given, x) in enumerate(zip(rows, xs, strict=True)):
        r = reference_rows(given, x, f"background[{i}]", "a background set")
        if r.is_complex() and not x.is_complex():
            raise InvalidTypeError(
                f"background[{i}] is complex but inputs[{i}] is not", argument="baselines"
            )
        dtype = x.dtype if x.is_floating_point() else torch.promote_types(x.dtype, r.dtype)
        out.append(r.to(device=x.device, dtype=dtype))
    n_rows = {r.shape[0] for r in out}
    if len(n_rows) != 1:
        raise BaselineError(
            f"every input's background must have the same number of rows, got {sorted(n_rows)}",
            argument="baselines",
        )
    (b,) = n_rows
    if b > MAX_ROWS:
        raise BaselineError(
            f"the background has {b} rows; at most {MAX_ROWS} are taken: summarise it (a "
            "weighted K-means summary, methods.kmeans)",
            argument="baselines",
        )
    return tuple(out), _weights(bg.weights, b, xs[0].device)


def _weights(weights: object, b: int, device: torch.device) -> Tensor:
    if weights is None:
        return torch.full((b,), 1.0 / b, dtype=torch.float64, device=device)
    w = torch.as_tensor(weights, dtype=torch.float64).to(device).reshape(-1)
    if w.shape[0] != b:
        raise BaselineError(
            f"the background has {b} rows but {w.shape[0]} weights; give one per row",
            argument="baselines",
        )
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise BaselineError(
            "background weights must be finite, non-negative and not all zero",
            argument="baselines",
        )
    return w / w.sum()


def tiled(xs: Tensors, rows: Tensors) -> tuple[Tensors, Tensors]:
    """The batch once per background row (copy ``b`` stacked ``b``-th, as ``Call.expanded``
    tiles) and each copy's baselines, its row repeated per example."""
    b = rows[0].shape[0]
    n = xs[0].shape[0]
    inputs = tuple(x.repeat((b,) + (1,) * (x.dim() - 1)) for x in xs)
    baselines = tuple(r.repeat_interleave(n, dim=0) for r in rows)
    return inputs, baselines


def fold(value: Any, n: int, weights: Tensor) -> Any:
    """A tiled call's per-row answer (tensors whose dim 0 is ``B * n``, nested in tuples and
    lists) as the weighted mean over the background rows, per example."""
    if isinstance(value, Tensor):
        b = weights.shape[0]
        if value.dim() == 0 or value.shape[0] != b * n:
            raise BaselineError(
                f"this method's answer has shape {tuple(value.shape)}, not one row per example, "
                "so it cannot be averaged over a background set; pass one baseline",
                argument="baselines",
            )
        per_row = value.reshape(b, n, *value.shape[1:])
        dtype = per_row.dtype if per_row.is_floating_point() else torch.float64
        w = weights.to(device=value.device, dtype=dtype).reshape(b, *(1,) * (value.dim()))
        return (per_row.to(dtype) * w).sum(0)
    if isinstance(value, tuple):
        return tuple(fold(v, n, weights) for v in value)
    if isinstance(value, list):
        return [fold(v, n, weights) for v in value]
    return value


def first(value: Tensor | None, n: int) -> Tensor | None:
    """What every copy of a tiled call shares (the outputs at the inputs): the first copy's."""
    return None if value is None else value[:n]
