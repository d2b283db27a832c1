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

import torch
from pydantic import Field

from methods.cancel import checkpoint
from methods.engine.call import Call, Output
from methods.engine.coalitions import all_coalitions
from methods.engine.linear_models import constrained_least_squares
from methods.engine.surrogate import prepare
from methods.params import SurrogateParams
from methods.registry import register


class KernelShapParams(SurrogateParams):
    n_samples: int = Field(
        25,
        gt=0,
        description="coalitions evaluated, counting the all-present and all-absent ones; at "
        "2**M or more every coalition is enumerated (exact Shapley values)",
    )


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
    n_random = p.n_samples - 2
    if m == 1:
        return s.finish(total.unsqueeze(1), p.return_input_shape, v_empty, exact=True)
    if p.n_samples >= 2**m:
        keep = all_coalitions(m, dev)[1:-1].unsqueeze(1)  # (2**M - 2, 1, M)
        k = keep.sum(2).squeeze(1)
        kernel = torch.tensor(
            [0.0] + [(m - 1) / (math.comb(m, j) * j * (m - j)) for j in range(1, m)],
            dtype=s.dtype,
            device=dev,
        )
        weights = kernel[k].unsqueeze(0).expand(b, -1)
    elif n_random <= 0:
        # Only the two fixed coalitions: the minimum-norm answer splits the total evenly.
        even = (total / m).unsqueeze(1).expand(b, m)
        return s.finish(even, p.return_input_shape, v_empty)  # no spread to measure
    else:
        # on the generator's device: a CUDA generator draws on CUDA only
        sizes = torch.arange(1, m, dtype=s.dtype, device=dev)
        probs = (m - 1) / (sizes * (m - sizes))
        k = (
            torch.multinomial(
                probs.expand(n_random * b, -1), 1, replacement=True, generator=call.generator
            )
            .reshape(n_random, b, 1)
            .to(dev)
            + 1
        )
        like = torch.empty(0, device=dev)
        draws = call.rand((n_random, b, m), like)
        keep = torch.empty(n_random, b, m, dtype=torch.bool, device=dev)
        for s0 in range(0, n_random, _RANK_ROWS):  # the k smallest draws of each row kept
            checkpoint()  # thousands of features: ranking all samples at once takes seconds
            rank = torch.argsort(torch.argsort(draws[s0 : s0 + _RANK_ROWS], dim=2), dim=2)
            keep[s0 : s0 + _RANK_ROWS] = rank < k[s0 : s0 + _RANK_ROWS]
        weights = torch.ones(b, n_random, dtype=s.dtype, device=dev)
    y = s.evaluate(keep)[0] - v_empty.unsqueeze(1)
    z = keep.expand(-1, b, -1).permute(1, 0, 2).to(s.dtype)  # (B, P, M)
    coef = constrained_least_squares(z, y, weights, total)
    if p.n_samples >= 2**m:
        return s.finish(coef, p.return_input_shape, v_empty, exact=True)
    error = _bootstrap_error(z, y, weights, total, call.generator)
    return s.finish(coef, p.return_input_shape, v_empty, error=error)


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
