"""LIME: a weighted linear surrogate fitted to the model around each example.

Ribeiro et al. 2016, https://arxiv.org/abs/1602.04938, with Captum's defaults: each
interpretable feature kept with probability 1/2 (absent ones take the baseline), samples
weighted by exp(-d^2 / (2 kernel_width^2)) with d the cosine distance between the flattened
input and the perturbed input, and a Lasso(alpha=0.01) surrogate. The surrogate is fitted in
torch for all examples at once (no scikit-learn).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from methods.engine.call import Call, Output
from methods.engine.coalitions import PerRow
from methods.engine.inputs import Tensors
from methods.engine.linear_models import lasso, least_squares
from methods.engine.surrogate import prepare
from methods.params import SurrogateParams
from methods.registry import register


class LimeParams(SurrogateParams):
    interpretable_model: Literal["lasso", "ridge", "linear_regression"] = Field(
        "lasso",
        description="the surrogate: weighted least squares with an L1 penalty (lasso), an L2 "
        "penalty (ridge), or none (linear_regression), fitted in torch",
    )
    alpha: float = Field(
        0.01,
        ge=0,
        description="penalty strength: lasso minimises sum(w (y - Xc - c0)^2) / (2 sum(w)) + "
        "alpha |c|_1, ridge sum(w (y - Xc - c0)^2) + alpha |c|^2 (w: sample weights)",
    )
    kernel_width: float = Field(1.0, gt=0, description="width of the exponential kernel")
    distance_mode: Literal["cosine", "euclidean"] = Field(
        "cosine", description="distance between the input and a perturbed input"
    )


def _similarity(xs: Tensors, rows: int, p: LimeParams, dtype: torch.dtype) -> PerRow:
    """Kernel weight of each perturbed row against the input it perturbs (per model row)."""
    orig = torch.cat([x.reshape(rows, -1).to(dtype) for x in xs], dim=1)  # (B, E)

    def per_row(inputs: Tensors, k: int) -> Tensor:
        pert = torch.cat([t.reshape(k, rows, -1).to(dtype) for t in inputs], dim=2)
        if p.distance_mode == "cosine":
            dot = (pert * orig).sum(2)
            norms = (pert * pert).sum(2) * (orig * orig).sum(1)
            d = 1 - dot / norms.clamp(min=1e-16).sqrt()  # torch's CosineSimilarity, eps 1e-8
        else:
            d = (pert - orig).norm(dim=2)
        return torch.exp(-(d**2) / (2 * p.kernel_width**2))

    return per_row


@register(
    "lime",
    generation="fitted",
    family="perturbation",
    params=LimeParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    stochastic=True,
    couples_examples=lambda p: True,  # one surrogate sampled for the call
    forward_only=True,
)
def lime(call: Call, p: LimeParams) -> Output:
    """LIME coefficients of the interpretable features (default baselines: zeros)."""
    s = prepare(call, p.feature_mask)
    m, b, dev = s.n_features, s.rows, call.inputs[0].device
    like = torch.empty(0, device=dev)
    keep = call.rand((p.n_samples, b, m), like) < 0.5
    y, sims = s.evaluate(keep, _similarity(call.inputs, b, p, s.dtype))
    w = sims.t() if sims is not None else torch.ones_like(y)  # (B, S)
    z = keep.permute(1, 0, 2).to(s.dtype)
    if p.interpretable_model == "lasso":
        coef, _ = lasso(z, y, w, p.alpha)
    else:
        ridge = p.alpha if p.interpretable_model == "ridge" else 0.0
        coef, _ = least_squares(z, y, w, ridge=ridge)
    return s.finish(coef, p.return_input_shape)
