"""Kernel SHAP: Shapley values as a weighted linear regression over sampled coalitions.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874. Coalition sizes are drawn with
P(k) ~ (M-1) / (k (M-k)) and members uniformly, as Captum does, and all examples are fitted
at once in torch. Two deliberate differences: the efficiency constraint (sum = f(x) - f(b)) is
imposed exactly instead of through two samples weighted 1e6, and when n_samples reaches 2**M
every coalition is enumerated with its exact Shapley kernel weight, which gives the exact
Shapley values.

``standard_error``: the spread of the fit over bootstrap resamples of the evaluated
coalitions (``_BOOTSTRAP`` refits, no further model evaluations; Efron 1979), 0 where every
coalition was enumerated.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine.call import Call, Output
from methods.engine.coalitions import all_coalitions, within_tolerance
from methods.engine.linear_models import constrained_least_squares
from methods.engine.surrogate import Surrogate, prepare
from methods.params import PositiveInt, SurrogateParams, auto_tolerance
from methods.registry import register

#: n_samples="auto": the most coalitions it draws
AUTO_MAX_SAMPLES = 1024


class KernelShapParams(SurrogateParams):
    n_samples: PositiveInt | Literal["auto"] = Field(  # type: ignore[assignment]
        25,
        description="coalitions evaluated, counting the all-present and all-absent ones; at "
        "2**M or more every coalition is enumerated (exact Shapley values); 'auto': rounds "
        "of coalitions until each example's largest standard error is at most tolerance x "
        f"its largest |attribution| (at most {AUTO_MAX_SAMPLES}, or every coalition)",
    )
    tolerance: float = auto_tolerance()


def _cost(p: KernelShapParams, shape: Any) -> int:
    return AUTO_MAX_SAMPLES if p.n_samples == "auto" else p.n_samples


#: bootstrap refits behind each standard error
_BOOTSTRAP = 32

#: samples ranked at once (each row on its own: blocks only bound the time between checkpoints)
_RANK_ROWS = 256


@register(
    "kernel_shap",
    generation="fitted",
    family="perturbation",
    params=KernelShapParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    stochastic=True,
    couples_examples=lambda p: True,  # one surrogate sampled for the call
    cost=_cost,
    auto_samples=AUTO_MAX_SAMPLES,
    forward_only=True,
    base_values=True,
)
def kernel_shap(call: Call, p: KernelShapParams) -> Output:
    """Kernel SHAP values of the interpretable features (default baselines: zeros)."""
    s = prepare(call, p.feature_mask)
    m, b, dev = s.n_features, s.rows, call.inputs[0].device
    empty = torch.zeros(1, 1, m, dtype=torch.bool, device=dev)
    v_empty = s.evaluate(empty)[0][:, 0]
    total = s.full - v_empty
    if m == 1:
        return s.finish(total.unsqueeze(1), p.return_input_shape, v_empty, exact=True)
    if p.n_samples == "auto":
        return _auto(call, p, s, v_empty, total)
    if p.n_samples >= 2**m:
        return _enumerated(s, p, v_empty, total)
    n_random = p.n_samples - 2
    if n_random <= 0:
        # Only the two fixed coalitions: the minimum-norm answer splits the total evenly.
        even = (total / m).unsqueeze(1).expand(b, m)
        return s.finish(even, p.return_input_shape, v_empty)  # no spread to measure
    keep = _sampled(call, m, b, n_random, s.dtype, dev)
    weights = torch.ones(b, n_random, dtype=s.dtype, device=dev)
    y = s.evaluate(keep)[0] - v_empty.unsqueeze(1)
    z = keep.expand(-1, b, -1).permute(1, 0, 2).to(s.dtype)  # (B, P, M)
    coef = constrained_least_squares(z, y, weights, total)
    error = _bootstrap_error(z, y, weights, total, call.generator)
    return s.finish(coef, p.return_input_shape, v_empty, error=error)


def _enumerated(s: Surrogate, p: KernelShapParams, v_empty: Tensor, total: Tensor) -> Output:
    """Every coalition with its exact Shapley kernel weight: the exact Shapley values."""
    m, b, dev = s.n_features, s.rows, s.call.inputs[0].device
    keep = all_coalitions(m, dev)[1:-1].unsqueeze(1)  # (2**M - 2, 1, M)
    k = keep.sum(2).squeeze(1)
    kernel = torch.tensor(
        [0.0] + [(m - 1) / (math.comb(m, j) * j * (m - j)) for j in range(1, m)],
        dtype=s.dtype,
        device=dev,
    )
    weights = kernel[k].unsqueeze(0).expand(b, -1)
    y = s.evaluate(keep)[0] - v_empty.unsqueeze(1)
    z = keep.expand(-1, b, -1).permute(1, 0, 2).to(s.dtype)  # (B, P, M)
    coef = constrained_least_squares(z, y, weights, total)
    return s.finish(coef, p.return_input_shape, v_empty, exact=True)


def _sampled(call: Call, m: int, b: int, n: int, dtype: torch.dtype, dev: torch.device) -> Tensor:
    """``n`` coalitions per row (n, B, M): sizes drawn with P(k) ~ (M-1) / (k (M-k)), members
    uniformly (the k smallest of uniform draws)."""
    # on the generator's device: a CUDA generator draws on CUDA only
    sizes = torch.arange(1, m, dtype=dtype, device=dev)
    probs = (m - 1) / (sizes * (m - sizes))
    k = (
        torch.multinomial(probs.expand(n * b, -1), 1, replacement=True, generator=call.generator)
        .reshape(n, b, 1)
        .to(dev)
        + 1
    )
    like = torch.empty(0, device=dev)
    draws = call.rand((n, b, m), like)
    keep = torch.empty(n, b, m, dtype=torch.bool, device=dev)
    for s0 in range(0, n, _RANK_ROWS):  # the k smallest draws of each row kept
        checkpoint()  # thousands of features: ranking all samples at once takes seconds
        rank = torch.argsort(torch.argsort(draws[s0 : s0 + _RANK_ROWS], dim=2), dim=2)
        keep[s0 : s0 + _RANK_ROWS] = rank < k[s0 : s0 + _RANK_ROWS]
    return keep


def _auto(call: Call, p: KernelShapParams, s: Surrogate, v_empty: Tensor, total: Tensor) -> Output:
    """Rounds of sampled coalitions (2M + 2 at first, then as many again each round), the
    surrogate refitted on all of them, until each example's largest standard error is within
    ``tolerance`` of its largest |coefficient|; every coalition enumerated (exact) once the
    rounds would reach 2**M."""
    m, b, dev = s.n_features, s.rows, call.inputs[0].device
    zs: list[Tensor] = []
    ys: list[Tensor] = []
    n = 0
    while True:
        more = max(32, 2 * m + 2) if n == 0 else min(n, AUTO_MAX_SAMPLES - 2 - n)
        if n + more + 2 >= 2**m:
            out = _enumerated(s, p, v_empty, total)
            out.echo["samples"] = {"n_samples": 2**m, "evaluations": n + 2**m}
            return out
        keep = _sampled(call, m, b, more, s.dtype, dev)
        ys.append(s.evaluate(keep)[0] - v_empty.unsqueeze(1))
        zs.append(keep.expand(-1, b, -1).permute(1, 0, 2).to(s.dtype))
        n += more
        z, y = torch.cat(zs, 1), torch.cat(ys, 1)
        weights = torch.ones(b, n, dtype=s.dtype, device=dev)
        coef = constrained_least_squares(z, y, weights, total)
        error = _bootstrap_error(z, y, weights, total, call.generator)
        if n + 2 >= AUTO_MAX_SAMPLES or within_tolerance(coef.t(), error.t(), p.tolerance):
            break
    out = s.finish(coef, p.return_input_shape, v_empty, error=error)
    out.echo["samples"] = {"n_samples": n + 2, "evaluations": n + 2}
    return out


def _bootstrap_error(
    z: torch.Tensor,
    y: torch.Tensor,
    weights: torch.Tensor,
    total: torch.Tensor,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The coefficients' standard deviation over refits on resamples (with replacement) of
    the P sampled coalitions, as multiplicities on their weights, scaled by
    sqrt(P / (P - M + 1)) for the M - 1 free coefficients the fit spends (the bootstrap's
    small-sample bias, as the residual variance's degrees of freedom): (B, M)."""
    n = int(z.shape[1])
    uniform = torch.ones(n, dtype=torch.float64)
    fits = []
    for _ in range(_BOOTSTRAP):
        checkpoint()
        draw = torch.multinomial(uniform, n, replacement=True, generator=_cpu(generator))
        counts = torch.bincount(draw, minlength=n).to(device=z.device, dtype=weights.dtype)
        fits.append(constrained_least_squares(z, y, weights * counts, total))
    m = int(z.shape[2])
    return torch.stack(fits).std(0) * math.sqrt(n / max(1, n - m + 1))


def _cpu(generator: torch.Generator | None) -> torch.Generator | None:
    """The call's generator where it draws on the CPU (a CUDA generator cannot)."""
    return generator if generator is None or generator.device.type == "cpu" else None
