"""Neurons of a layer: Captum's ``neuron_selector`` forms, and a neuron's input gradients."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from methods.engine.batching import forward_done
from methods.engine.inputs import Forward, Tensors
from methods.engine.layers import run, tap
from methods.errors import InvalidArgumentError


def select_neuron(values: Tensors, selector: Any) -> Tensor:
    """One value per row of the layer, or one for the whole batch: Captum's
    ``neuron_selector`` semantics.

    An int or a tuple of ints/slices indexes the layer's (single) tensor without its batch
    dim, slice selections are summed; a callable receives the layer's tensor (a tuple when it
    has several) and returns one value per row, or a 0-d tensor aggregating the batch
    (Captum's ``lambda out: out.sum()``), which is returned as it is: gradients of it are the
    per-example gradients when the rows are independent, as in Captum.
    """
    rows = values[0].shape[0]
    if callable(selector):
        out = selector(values if len(values) > 1 else values[0])
        if isinstance(out, Tensor) and out.dim() == 0:
            return out
        if not isinstance(out, Tensor) or out.shape[0] != rows or out[0].numel() != 1:
            raise InvalidArgumentError(
                f"neuron_selector (a callable) must return a tensor of shape ({rows},), one "
                "value per example, or a 0-d tensor, one value for the whole batch; got "
                f"{getattr(out, 'shape', type(out).__name__)}",
                argument="neuron_selector",
            )
        return out.reshape(rows)
    if len(values) > 1:
        raise InvalidArgumentError(
            f"the layer has {len(values)} tensors; select a neuron with a callable neuron_selector",
            argument="neuron_selector",
        )
    index = (selector,) if isinstance(selector, int) else tuple(selector)
    v = values[0]
    if len(index) > v.dim() - 1:
        raise InvalidArgumentError(
            f"neuron_selector {selector!r} has {len(index)} indices but the layer's tensor "
            f"{tuple(v.shape)} has {v.dim() - 1} dims after the batch dim",
            argument="neuron_selector",
        )
    for d, i in enumerate(index):
        if isinstance(i, int) and not -v.shape[d + 1] <= i < v.shape[d + 1]:
            raise InvalidArgumentError(
                f"neuron_selector index {i} is out of range for layer dim {d + 1} of size "
                f"{v.shape[d + 1]} (layer shape {tuple(v.shape)})",
                argument="neuron_selector",
            )
    sel = v[(slice(None), *index)]
    if any(isinstance(i, slice) for i in index):
        return sel.reshape(rows, -1).sum(1)
    if sel[0].numel() != 1:
        raise InvalidArgumentError(
            f"neuron_selector {selector!r} selects {sel[0].numel()} values per example from "
            f"the layer of shape {tuple(v.shape)}; give an index for every dim, or slices "
            "(which are summed)",
            argument="neuron_selector",
        )
    return sel.reshape(rows)


def check_selector(selector: Any) -> Any:
    """Normalise a ``neuron_selector``: an int, a tuple of ints/slices, or a callable."""
    if callable(selector):
        return selector
    if isinstance(selector, bool):
        raise InvalidArgumentError("neuron_selector must not be a bool", argument="neuron_selector")
    if isinstance(selector, int):
        return selector
    if isinstance(selector, (tuple, list)) and selector:
        out = []
        for i in selector:
            if isinstance(i, bool) or not isinstance(i, (int, slice)):
                raise InvalidArgumentError(
                    f"neuron_selector entries must be ints or slices, got {i!r}",
                    argument="neuron_selector",
                )
            out.append(i)
        return tuple(out)
    raise InvalidArgumentError(
        "neuron_selector must be an int, a non-empty tuple of ints/slices, or a callable, got "
        f"{selector!r}",
        argument="neuron_selector",
    )


def neuron_gradients(
    forward: Forward,
    xs: Tensors,
    module: nn.Module,
    path: str,
    to_input: bool,
    selector: Any,
) -> tuple[Tensors, Tensor]:
    """d(selected neuron)/d(inputs) and the neuron's values; the forward stops at the layer."""
    with torch.enable_grad(), tap(module, path, to_input=to_input, stop=True) as t:
        leaves = tuple(x.detach().requires_grad_(True) for x in xs)
        run(forward, leaves, t)
        neuron = select_neuron(t.values, selector)
        if not neuron.requires_grad:
            grads: tuple[Tensor | None, ...] = (None,) * len(leaves)
        else:
            forward_done()
            grads = torch.autograd.grad(neuron.sum(), leaves, allow_unused=True)
    return (
        tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True)),
        neuron.detach(),
    )
