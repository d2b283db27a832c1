"""A weighted K-means summary of a background set, as ``shap.kmeans`` makes one.

``kmeans(rows, k)`` clusters the rows (k-means++ seeding, Lloyd's iterations, the best of
``n_init`` runs by inertia, as scikit-learn's ``KMeans``), snaps each centre's every feature to
the nearest value that feature takes in the data (so discrete features keep valid values:
shap's ``round_values``) and weighs each centre by the rows it stands for. Missing values (NaN)
are imputed with their feature's mean first, as shap does. Deterministic for a given ``seed``.
Plain torch, so the service summarises a models.toml ``background`` without scikit-learn.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.engine.background import Background
from methods.errors import InvalidArgumentError, InvalidTypeError


def kmeans(
    rows: Tensor,
    k: int,
    *,
    round_values: bool = True,
    seed: int = 0,
    n_init: int = 10,
    max_iter: int = 300,
) -> Background:
    """``k`` weighted centres summarising ``rows`` (``(B, *example_shape)``)."""
    if not isinstance(rows, Tensor):
        raise InvalidTypeError(
            f"rows must be a Tensor, got {type(rows).__name__}", argument="background"
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidArgumentError(
            f"k must be a positive int, got {k!r}", argument="background_kmeans"
        )
    if rows.dim() < 1 or rows.shape[0] < 1:
        raise InvalidArgumentError("a background needs at least one row", argument="background")
    shape = rows.shape[1:]
    x = rows.reshape(rows.shape[0], -1).to(torch.float64)
    x = _imputed(x)
    b = x.shape[0]
    if k >= b:  # as many centres as rows: the rows themselves, one each
        return Background(rows.clone(), torch.ones(b, dtype=torch.float64))
    gen = torch.Generator().manual_seed(seed)
    runs = [_lloyd(x, _plus_plus(x, k, gen), max_iter) for _ in range(max(1, n_init))]
    centres, labels, _ = min(runs, key=lambda run: run[2])
    if round_values:
        nearest = (x.unsqueeze(0) - centres.unsqueeze(1)).abs().argmin(dim=1)  # (k, D)
        centres = torch.gather(x, 0, nearest)
    weights = torch.bincount(labels, minlength=k).to(torch.float64)
    return Background(centres.reshape(k, *shape).to(rows.dtype), weights)


def _imputed(x: Tensor) -> Tensor:
    missing = torch.isnan(x)
    if not bool(missing.any()):
        return x
    means = torch.nanmean(x, dim=0).nan_to_num(0.0)
    return torch.where(missing, means.expand_as(x), x)


def _plus_plus(x: Tensor, k: int, gen: torch.Generator) -> Tensor:
    """k-means++ seeding: each next centre drawn with probability proportional to its squared
    distance from the nearest centre chosen (greedy over 2 + log k candidates, as sklearn)."""
    b = x.shape[0]
    trials = 2 + int(torch.tensor(float(k)).log().item())
    first = int(torch.randint(b, (1,), generator=gen).item())
    centres = [x[first]]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in range(1, k):
        total = float(d2.sum())
        if total <= 0:  # every row sits on a centre: the rest are copies
            pick = torch.randint(b, (trials,), generator=gen)
        else:
            pick = torch.multinomial(d2 / total, trials, replacement=True, generator=gen)
        cand = ((x.unsqueeze(0) - x[pick].unsqueeze(1)) ** 2).sum(2)  # (trials, B)
        pot = torch.minimum(cand, d2.unsqueeze(0)).sum(1)
        j = int(pot.argmin())
        centres.append(x[pick[j]])
        d2 = torch.minimum(d2, cand[j])
    return torch.stack(centres)


def _lloyd(x: Tensor, centres: Tensor, max_iter: int) -> tuple[Tensor, Tensor, float]:
    tol = 1e-4 * float(x.var(dim=0, unbiased=False).mean())
    labels = torch.zeros(x.shape[0], dtype=torch.long)
    for _ in range(max_iter):
        d2 = torch.cdist(x, centres).pow(2)
        labels = d2.argmin(1)
        sums = torch.zeros_like(centres).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=centres.shape[0]).to(x.dtype)
        moved = torch.where(
            counts.unsqueeze(1) > 0, sums / counts.clamp(min=1).unsqueeze(1), centres
        )
        shift = float(((moved - centres) ** 2).sum())
        centres = moved
        if shift <= tol:
            break
    d2 = torch.cdist(x, centres).pow(2)
    labels = d2.argmin(1)
    return centres, labels, float(d2.gather(1, labels.unsqueeze(1)).sum())
