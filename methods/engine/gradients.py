"""Gradients of the targeted output with respect to inputs (Captum's ``compute_gradients``)."""

from __future__ import annotations

import torch
from torch import Tensor

from methods.engine.inputs import Forward, Tensors
from methods.engine.targets import Target


def gradients(forward: Forward, xs: Tensors, target: Target) -> tuple[Tensors, Tensor]:
    """d(sum of targeted outputs)/d(inputs), and the targeted outputs (detached).

    Summing is exact for models whose rows are independent, and equals Captum's
    ``autograd.grad(torch.unbind(selected))`` in every case.
    """
    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_(True) for x in xs)
        selected = target.select(forward(leaves))
        grads = torch.autograd.grad(selected.sum(), leaves, allow_unused=True)
    return (
        tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)),
        selected.detach(),
    )


def outputs(forward: Forward, xs: Tensors, target: Target) -> Tensor:
    """Targeted outputs under no_grad, shape (rows,)."""
    with torch.no_grad():
        return target.select(forward(xs))
