"""Gradients of the targeted output with respect to inputs (Captum's ``compute_gradients``)."""

from __future__ import annotations

import torch
from torch import Tensor

from methods.engine.batching import forward_done
from methods.engine.inputs import Forward, Tensors
from methods.engine.targets import Target


def gradients(forward: Forward, xs: Tensors, target: Target) -> tuple[Tensors, Tensor]:
    """d(sum of targeted outputs)/d(inputs), and the targeted outputs (detached).

    Summing is exact for models whose rows are independent, and equals Captum's
    ``autograd.grad(torch.unbind(selected))`` in every case.
    """
    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_(True) for x in xs)
        selected = target.select(forward(leaves))  # checks the target against the output
        forward_done()
        grads = (
            torch.autograd.grad(selected, leaves, torch.ones_like(selected), allow_unused=True)
            if selected.requires_grad
            else (None,) * len(leaves)
        )
    return (
        tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)),
        selected.detach(),
    )


def grad_of_sum(selected: Tensor, leaves: Tensors) -> tuple[Tensor | None, ...]:
    """Gradients of ``selected.sum()``; None for every leaf when the output is constant in them.

    An output that does not require grad (detached, integer, or independent of the inputs)
    has zero gradient everywhere, as an input the output does not use has.
    """
    if not selected.requires_grad:
        return (None,) * len(leaves)
    forward_done()
    return torch.autograd.grad(selected.sum(), leaves, allow_unused=True)


def outputs(forward: Forward, xs: Tensors, target: Target) -> Tensor:
    """Targeted outputs under no_grad, shape (rows,)."""
    with torch.no_grad():
        return target.select(forward(xs))
