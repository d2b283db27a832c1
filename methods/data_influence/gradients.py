"""Per-example quantities of one chunk of examples under one checkpoint's weights.

The model (a ``private_copy`` of the caller's) is evaluated with
``torch.func.functional_call`` on the checkpoint's tensors, so the caller's parameters,
buffers, mode and ``requires_grad`` flags are never touched; hooks are removed in
``finally``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from methods.data_influence.common import State, Tensors, example_losses, module_at
from methods.engine import hooks
from methods.errors import (
    AttributionError,
    InvalidArgumentError,
    InvalidTypeError,
    ModelError,
)

Hook = Callable[[nn.Module, tuple[Any, ...], Any], Any]


def private_copy(model: nn.Module) -> nn.Module:
    """The model's module tree copied with its parameters and buffers shared, not copied:
    checkpoint tensors are swapped into the copy's modules (``functional_call``) and hooks put
    on them, so the caller's model never changes, also for other threads using it meanwhile.
    The model itself if it cannot be copied."""
    memo: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    try:
        return copy.deepcopy(model, memo)
    except Exception:
        return model


@contextmanager
def _hooked(module: nn.Module, hook: Hook) -> Iterator[None]:
    """``hook`` on ``module``'s forward for this block."""
    handle = hooks.hold(module.register_forward_hook, hook)
    try:
        yield
    finally:
        handle.remove()


def _call(model: nn.Module, state: State | None, xs: Tensors) -> Any:
    try:
        return model(*xs) if state is None else functional_call(model, state, xs)
    except (AttributionError, torch.OutOfMemoryError):
        raise
    except Exception as exc:
        raise ModelError(
            f"the model raised {type(exc).__name__}: {exc}", argument="inputs"
        ) from exc


def _output(out: Any, n: int) -> Tensor:
    if not isinstance(out, Tensor):
        raise InvalidTypeError(
            f"the model must return a Tensor, got {type(out).__name__}", argument="model"
        )
    if out.dim() == 0 or out.shape[0] != n:
        raise InvalidArgumentError(
            f"the model output must have one row per example ({n}), got shape {tuple(out.shape)}",
            argument="model",
        )
    return out


def parameter_names(model: nn.Module, paths: list[str] | None) -> list[str]:
    """The parameters TracInCP differentiates: every trainable one (every one, as Captum's,
    when none is trainable: a model frozen for serving), or every one of the modules at
    ``paths`` (in their order, as Captum's ``layers``), by their state-dict name."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    if paths is None:
        named = list(model.named_parameters())
        names = [name for name, p in named if p.requires_grad] or [name for name, _ in named]
        if not names:
            raise InvalidArgumentError("the model has no parameters", argument="model")
        return names
    names = []
    for path in paths:
        for p in module_at(model, path).parameters():
            name = canonical[id(p)]
            if name not in names:
                names.append(name)
    if not names:
        raise InvalidArgumentError(
            f"the layers {paths} have no parameters to differentiate", argument="layers"
        )
    return names


class ParamGrads:
    """Flattened per-example gradients of each example's loss with respect to ``names``:
    ``vmap(grad(...))`` over the chunk, or, once that fails on the model (in-place updates
    of buffers, random ops), one backward per example from one forward (Captum's loop)."""

    def __init__(self, model: nn.Module, names: list[str], loss: str) -> None:
        self.model, self.names, self.loss = model, names, loss
        self.use_vmap = True

    def __call__(self, state: State, xs: Tensors, y: Tensor) -> Tensor:
        diff = {name: state[name] for name in self.names}
        rest = {k: v for k, v in state.items() if k not in diff}
        if self.use_vmap:
            try:
                return self._vmap(diff, rest, xs, y)
            except (InvalidArgumentError, InvalidTypeError, torch.OutOfMemoryError):
                raise
            except Exception:
                self.use_vmap = False
        return self._loop(diff, rest, xs, y)

    def _vmap(self, diff: State, rest: State, xs: Tensors, y: Tensor) -> Tensor:
        model, loss = self.model, self.loss

        def one(d: State, *args: Tensor) -> Tensor:
            *x1, y1 = args
            out = functional_call(model, (rest, d), tuple(a.unsqueeze(0) for a in x1))
            return example_losses(loss, _output(out, 1), y1.unsqueeze(0)).sum()

        dims = (None,) + (0,) * (len(xs) + 1)
        with torch.enable_grad():
            grads = vmap(grad(one), in_dims=dims)(diff, *xs, y)
        n = y.shape[0]
        return torch.cat([grads[name].detach().reshape(n, -1) for name in self.names], dim=1)

    def _loop(self, diff: State, rest: State, xs: Tensors, y: Tensor) -> Tensor:
        n = y.shape[0]
        leaves = {k: v.detach().requires_grad_(True) for k, v in diff.items()}
        params = [leaves[name] for name in self.names]
        with torch.enable_grad():
            out = _output(_call(self.model, {**rest, **leaves}, xs), n)
            losses = example_losses(self.loss, out, y)
            rows = []
            for i in range(n):
                gs = torch.autograd.grad(
                    losses[i], params, retain_graph=i < n - 1, allow_unused=True
                )
                rows.append(
                    torch.cat(
                        [
                            (torch.zeros_like(p) if g is None else g).reshape(-1)
                            for g, p in zip(gs, params, strict=True)
                        ]
                    )
                )
        return torch.stack(rows).detach()


def fast_features(
    model: nn.Module, state: State, path: str, loss: str, xs: Tensors, y: Tensor
) -> tuple[Tensor, Tensor]:
    """TracInCPFast's two factors of a linear layer's per-example weight gradient: the loss
    gradient with respect to the layer's output (n, out) and the layer's input (n, in)."""
    module = module_at(model, path)
    seen: dict[str, Any] = {"calls": 0}

    def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        seen["calls"] += 1
        if seen["calls"] > 1 or not isinstance(output, Tensor) or not args:
            return None
        seen["input"] = args[0].detach() if isinstance(args[0], Tensor) else None
        leaf = output.detach().requires_grad_(True)
        seen["leaf"] = leaf
        return leaf.clone()  # in-place ops after the layer leave the leaf intact

    n = y.shape[0]
    with _hooked(module, hook), torch.enable_grad():
        out = _output(_call(model, state, xs), n)
    if seen["calls"] != 1 or seen.get("input") is None:
        raise InvalidArgumentError(
            f"layer {path!r} must run exactly once per forward pass on a tensor, it ran "
            f"{seen['calls']} times",
            argument="layers",
        )
    leaf, a = seen["leaf"], seen["input"]
    if leaf.dim() != 2 or a.dim() != 2 or leaf.shape[0] != n or a.shape[0] != n:
        raise InvalidArgumentError(
            f"layer {path!r} must take and return (examples, features) tensors, got input "
            f"{tuple(a.shape)} and output {tuple(leaf.shape)}",
            argument="layers",
        )
    with torch.enable_grad():
        total = example_losses(loss, out, y).sum()
        (g,) = torch.autograd.grad(total, leaf, allow_unused=True)
    if g is None:
        raise InvalidArgumentError(
            f"the loss does not depend on the output of layer {path!r}", argument="layers"
        )
    return g.detach(), a


def activations(model: nn.Module, path: str, xs: Tensors) -> Tensor:
    """The layer's output for each example, flattened (n, features), from the model as it
    is (Captum's ``LayerActivation``, under no_grad)."""
    module = module_at(model, path)
    seen: dict[str, Any] = {"calls": 0, "value": None}

    def hook(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        seen["calls"] += 1
        seen["value"] = output

    n = xs[0].shape[0]
    with _hooked(module, hook), torch.no_grad():
        _call(model, None, xs)
    value = seen["value"]
    if seen["calls"] != 1:
        raise InvalidArgumentError(
            f"layer {path!r} must run exactly once per forward pass, it ran {seen['calls']} times",
            argument="layers",
        )
    if not isinstance(value, Tensor) or value.dim() == 0 or value.shape[0] != n:
        raise InvalidArgumentError(
            f"layer {path!r} must return one tensor with a row per example",
            argument="layers",
        )
    return value.detach().reshape(n, -1)
