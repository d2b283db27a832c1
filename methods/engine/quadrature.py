"""Integration rules for path methods: points (alphas) on [0, 1] and their weights.

Exact in float64. Two deliberate differences from Captum 0.9.0 (see README):
Captum rounds alphas and weights through float32, and its trapezoid rule spaces the points
1/(n-1) apart but weights them 1/n, so its weights sum to (n-1)/n. Ours are the true rules.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import numpy as np
import torch

from methods.errors import InvalidArgumentError

ApproximationMethod = Literal[
    "riemann_left", "riemann_right", "riemann_middle", "riemann_trapezoid", "gausslegendre",
    "clenshaw_curtis",
]  # fmt: skip
APPROXIMATION_METHODS: tuple[str, ...] = (
    "riemann_left",
    "riemann_right",
    "riemann_middle",
    "riemann_trapezoid",
    "gausslegendre",
    "clenshaw_curtis",
)
#: Captum's rules (``clenshaw_curtis`` is ours: nested, for n_steps="auto")
CAPTUM_METHODS: tuple[str, ...] = APPROXIMATION_METHODS[:5]


def clenshaw_curtis(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Clenshaw-Curtis on [0, 1] with ``n`` points: the Chebyshev extreme points
    (1 - cos(j pi / N)) / 2, j = 0..N = n - 1, both ends included, and weights that integrate
    every polynomial of degree < n exactly (Waldvogel's closed form; all positive, summing to
    1). As accurate as Gauss-Legendre on smooth paths, and nested: the points of N intervals
    are among those of 2N, so n_steps="auto" reuses every gradient it took."""
    big_n = n - 1
    j = np.arange(n, dtype=np.float64)
    alphas = 0.5 * (1.0 - np.cos(j * np.pi / big_n))
    k = np.arange(1, big_n // 2 + 1, dtype=np.float64)
    b = np.where(2 * k == big_n, 1.0, 2.0) / (4.0 * k * k - 1.0)
    s = (b[None, :] * np.cos(2.0 * np.pi * np.outer(j, k) / big_n)).sum(axis=1)
    c = np.where((j == 0) | (j == big_n), 1.0, 2.0)
    return alphas, 0.5 * c / big_n * (1.0 - s)


#: rules kept (each at most a few MB: n is bounded by the caller's step limit); bounded by
#: count, since Gauss-Legendre costs O(n^3) to build and a served model repeats a few n
RULE_CACHE_SIZE = 256


@lru_cache(maxsize=RULE_CACHE_SIZE)
def rule(method: str, n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(alphas, weights)`` of ``method`` with ``n`` points."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InvalidArgumentError(
            f"n_steps must be an integer >= 1, got {n!r}", argument="n_steps"
        )
    k = np.arange(n, dtype=np.float64)
    if method == "gausslegendre":
        nodes, w = np.polynomial.legendre.leggauss(n)
        alphas, weights = 0.5 * (nodes + 1.0), 0.5 * w
    elif method == "riemann_left":
        alphas, weights = k / n, np.full(n, 1.0 / n)
    elif method == "riemann_right":
        alphas, weights = (k + 1.0) / n, np.full(n, 1.0 / n)
    elif method == "riemann_middle":
        alphas, weights = (k + 0.5) / n, np.full(n, 1.0 / n)
    elif method == "riemann_trapezoid":
        if n < 2:
            raise InvalidArgumentError(
                "riemann_trapezoid needs n_steps >= 2 (both end points)", argument="n_steps"
            )
        alphas = k / (n - 1)
        weights = np.full(n, 1.0 / (n - 1))
        weights[0] = weights[-1] = 0.5 / (n - 1)
    elif method == "clenshaw_curtis":
        if n < 2:
            raise InvalidArgumentError(
                "clenshaw_curtis needs n_steps >= 2 (both end points)", argument="n_steps"
            )
        alphas, weights = clenshaw_curtis(n)
    else:
        raise InvalidArgumentError(
            f"approximation_method must be one of {', '.join(APPROXIMATION_METHODS)}, got "
            f"{method!r}",
            argument="approximation_method",
        )
    return tuple(float(a) for a in alphas), tuple(float(w) for w in weights)


@lru_cache(maxsize=RULE_CACHE_SIZE)  # read-only tensors: built once per (rule, n, dtype, device)
def rule_tensors(
    method: str, n: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    alphas, weights = rule(method, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return (
        torch.tensor(alphas, dtype=dtype, device=device),
        torch.tensor(weights, dtype=dtype, device=device),
    )
