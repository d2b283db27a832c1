"""Partial dependence and individual conditional expectation (ICE) of a tabular model: how its
output moves as one feature sweeps a grid with the other features as each row has them
(Friedman 2001; Goldstein et al. 2015), as scikit-learn's ``partial_dependence(...,
method="brute")`` computes them on the same grid.

The grid of a feature is scikit-learn's: its distinct values where there are fewer than
``grid_resolution``, else ``grid_resolution`` evenly spaced points between the rows'
``percentiles`` (SciPy's ``mquantiles``, Hazen-like plotting positions alpha = beta = 0.4).
Every grid value of every row is one row of one batched forward (chunks of ``batch_size``
rows), not a forward per grid value as the reference loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from methods.engine.guard import model_guard
from methods.engine.outputs import check_scale, scaled
from methods.errors import InvalidArgumentError, InvalidTypeError

Kind = Literal["average", "individual", "both"]
#: SciPy's mquantiles defaults (and scikit-learn's grid): alpha = beta = 0.4
ALPHAP = BETAP = 0.4
#: rows per forward when none is given
BATCH_ROWS = 4096


@dataclass(frozen=True)
class FeatureDependence:
    """One feature's curves: the grid, the output averaged over the rows at each grid value,
    and each row's own curve (``[N, G]``)."""

    feature: int
    grid: np.ndarray
    average: np.ndarray | None
    individual: np.ndarray | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "feature": self.feature,
            "grid": self.grid.tolist(),
            "average": None if self.average is None else self.average.tolist(),
            "individual": None if self.individual is None else self.individual.tolist(),
        }


def mquantiles(column: np.ndarray, probs: tuple[float, float]) -> np.ndarray:
    """SciPy's ``mstats.mquantiles(column, prob=probs)`` (alphap = betap = 0.4)."""
    x = np.sort(np.asarray(column, dtype=np.float64))
    n = x.size
    p = np.asarray(probs, dtype=np.float64)
    m = ALPHAP + p * (1.0 - ALPHAP - BETAP)
    aleph = n * p + m
    k = np.floor(np.clip(aleph, 1, n - 1)).astype(int)
    gamma = np.clip(aleph - k, 0, 1)
    return (1.0 - gamma) * x[k - 1] + gamma * x[k]


def grid_of(
    column: np.ndarray, grid_resolution: int, percentiles: tuple[float, float], feature: int
) -> np.ndarray:
    """A feature's grid, as scikit-learn builds it."""
    uniques = np.unique(column)
    if uniques.shape[0] < grid_resolution:
        return uniques.astype(np.float64)
    low, high = mquantiles(column, percentiles)
    if np.allclose(low, high):
        raise InvalidArgumentError(
            f"feature {feature}: its percentiles {list(percentiles)} are too close to each "
            "other to build a grid (a column of nearly one value); choose percentiles further "
            "apart",
            argument="percentiles",
        )
    return np.linspace(low, high, num=grid_resolution, endpoint=True)


def partial_dependence(
    model: Any,
    inputs: torch.Tensor,
    features: list[int],
    *,
    target: int | None = None,
    grid_resolution: int = 15,
    percentiles: tuple[float, float] = (0.05, 0.95),
    kind: Kind = "average",
    output: str | None = None,
    multi_label: bool = False,
    batch_size: int | None = None,
) -> list[FeatureDependence]:
    """Each of ``features``' partial dependence (``kind`` "average"), ICE curves
    ("individual") or both, of ``model``'s output ``target`` (on the ``output`` scale) over
    ``inputs`` ([N, F] rows)."""
    x = _check(inputs, features, grid_resolution, percentiles, kind)
    scale = check_scale(output)
    rows = batch_size or BATCH_ROWS
    column_data = x.detach().cpu().numpy()
    out: list[FeatureDependence] = []
    with model_guard(model), torch.no_grad():
        for f in features:
            grid = grid_of(column_data[:, f], grid_resolution, percentiles, f)
            values = _curves(model, x, f, grid, target, scale, multi_label, rows)  # [N, G]
            out.append(FeatureDependence(
                f, grid,
                values.mean(axis=0) if kind in ("average", "both") else None,
                values if kind in ("individual", "both") else None,
            ))  # fmt: skip
    return out


def _curves(
    model: Any,
    x: torch.Tensor,
    f: int,
    grid: np.ndarray,
    target: int | None,
    scale: Any,
    multi_label: bool,
    rows: int,
) -> np.ndarray:
    """Every row's output at every grid value of feature ``f``: [N, G], grid-major batches."""
    n, g = x.shape[0], grid.shape[0]
    values = torch.as_tensor(grid, dtype=x.dtype, device=x.device)
    flat = x.unsqueeze(0).repeat(g, 1, 1)  # [G, N, F]
    flat[:, :, f] = values[:, None]
    flat = flat.reshape(g * n, -1)
    parts = []
    for start in range(0, g * n, rows):
        y = scaled(model(flat[start : start + rows]), scale, multi_label)
        parts.append(_selected(y, target))
    return torch.cat(parts).reshape(g, n).T.double().cpu().numpy()


def _selected(y: torch.Tensor, target: int | None) -> torch.Tensor:
    """The targeted output of each row: its one output, or class ``target``."""
    if not isinstance(y, torch.Tensor):
        raise InvalidTypeError(
            f"the model must return a tensor of scores, got {type(y).__name__}", argument="model"
        )
    flat = y.reshape(y.shape[0], -1)
    if target is None:
        if flat.shape[1] != 1:
            raise InvalidArgumentError(
                f"the model has {flat.shape[1]} outputs per row: name the one to follow (target)",
                argument="target",
            )
        return flat[:, 0]
    if not 0 <= target < flat.shape[1]:
        raise InvalidArgumentError(
            f"target {target} is out of range: the model has {flat.shape[1]} outputs per row",
            argument="target",
        )
    return flat[:, target]


def _check(
    inputs: Any,
    features: list[int],
    grid_resolution: int,
    percentiles: tuple[float, float],
    kind: str,
) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or not inputs.is_floating_point():
        raise InvalidTypeError(
            "partial dependence takes tabular rows, a floating [N, F] tensor", argument="inputs"
        )
    if inputs.shape[0] < 1:
        raise InvalidArgumentError("inputs has no rows", argument="inputs")
    width = int(inputs.shape[1])
    if not features:
        raise InvalidArgumentError("features is empty: name at least one", argument="features")
    for i, f in enumerate(features):
        if isinstance(f, bool) or not isinstance(f, int) or not 0 <= f < width:
            raise InvalidArgumentError(
                f"features[{i}] = {f!r} is not a feature of these rows (0..{width - 1})",
                argument=f"features.{i}",
            )
    if (
        isinstance(grid_resolution, bool)
        or not isinstance(grid_resolution, int)
        or grid_resolution <= 1
    ):
        raise InvalidArgumentError(
            f"grid_resolution must be an integer > 1, got {grid_resolution!r}",
            argument="grid_resolution",
        )
    low, high = percentiles
    if not (0 <= low < high <= 1):
        raise InvalidArgumentError(
            f"percentiles must be [low, high] with 0 <= low < high <= 1, got {list(percentiles)}",
            argument="percentiles",
        )
    if kind not in ("average", "individual", "both"):
        raise InvalidArgumentError(
            f"kind must be average, individual or both, got {kind!r}", argument="kind"
        )
    return inputs
