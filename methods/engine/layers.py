"""Layers: find a module by dotted path, and read or replace what it sees during a forward.

Every hook lives inside a context manager and is removed in ``finally``, also when the
forward raises. A *tap* on a layer records the tensors the layer receives (``to_input``) or
returns, and can hand the rest of the model something else in their place:

- ``mode="read"``: record, change nothing (activations, neuron values, gradients that must
  flow back through the layer to the inputs).
- ``mode="cut"``: give the rest of the model fresh leaves holding the same values, so the
  gradient of the output with respect to the layer is exactly ``grad(out, tap.leaves)`` and the
  backward pass stops at the layer (token-id inputs need no gradient at all).
- ``mode="swap"``: give the rest of the model the tensors in ``tap.replacement`` (layer
  integrated gradients: the interpolated activations), as leaves to differentiate.

Layer results are tuples here; the API returns a tuple when the layer has several tensors
(Captum's rule), a single tensor otherwise. A layer whose value nests tuples (an LSTM's
``out, (h, c)``) is flattened depth first, every tensor attributed, and the API re-nests the
attributions in the layer's structure (``recording``). Every tensor must carry the batch: in
dim 0, or for a recurrent module's hidden states (and a seq-first ``out``) in dim 1, which the
tap moves to dim 0 so attributions are batch-first like every other.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from methods.engine import hooks
from methods.engine.batching import forward_done
from methods.engine.inputs import Forward, Tensors
from methods.engine.precision import working_dtype
from methods.engine.targets import Target
from methods.errors import (
    AttributionError,
    InvalidArgumentError,
    UnsupportedLayerError,
    UnsupportedModelError,
)

TapMode = Literal["read", "cut", "swap", "graft"]


def resolve(model: Any, path: object) -> nn.Module:
    """The submodule at dotted ``path`` (as ``model.get_submodule``), or an error naming the
    nearest valid paths."""
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            "layer and neuron methods hook a module of the model, so the model must be a "
            f"torch.nn.Module, got {type(model).__name__}",
            argument="layer",
        )
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(
            f"layer must be a non-empty dotted module path such as 'features.3', got {path!r}",
            argument="layer",
        )
    try:
        return model.get_submodule(path)
    except AttributeError:
        names = [n for n, _ in model.named_modules() if n]
        close = difflib.get_close_matches(path, names, n=5, cutoff=0.3)
        shown = close or names[:10]
        label = "nearest valid layers" if close else "valid layers include"
        raise InvalidArgumentError(
            f"the model has no layer {path!r}; {label}: {', '.join(shown) or 'none'}",
            argument="layer",
        ) from None


class _Stop(AttributionError):
    """Raised from a hook to end the forward once the layer has been seen."""


@dataclass
class Tap:
    """What a tapped layer saw in the last forward (tensors only, in call order)."""

    path: str
    to_input: bool
    mode: TapMode
    stop: bool = False
    replacement: Tensors | None = None
    values: Tensors = ()
    leaves: Tensors = ()
    calls: int = 0
    #: rows the forward runs on (set by ``run``): every layer tensor must carry them
    rows: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.values, self.leaves, self.calls = (), (), 0

    def check_ran(self) -> None:
        if self.calls == 0:
            raise InvalidArgumentError(
                f"layer {self.path!r} did not run during the forward pass; pick a module the "
                "model calls",
                argument="layer",
            )
        if self.calls > 1:
            raise InvalidArgumentError(
                f"layer {self.path!r} ran {self.calls} times in one forward pass; layer "
                "attribution needs a module that runs once (pick a module that is not reused)",
                argument="layer",
            )

    def _new(self, values: Tensors) -> Tensors | None:
        """The tensors the rest of the model gets instead of ``values`` (None: unchanged)."""
        self.calls += 1
        if self.calls > 1 and self.mode != "read":
            return None  # reported by check_ran after the forward
        self.values = values
        if self.mode == "read":
            return None
        if self.mode in ("cut", "graft"):
            self.leaves = tuple(
                v.detach().requires_grad_(v.is_floating_point() or v.is_complex()) for v in values
            )
            if self.mode == "graft":
                # the leaf's value, with the gradient flowing on to the layer's own inputs
                # too: a layer tapped before this one still gets its gradient through it
                return tuple(
                    _Graft.apply(leaf, v) if v.requires_grad else leaf.clone()
                    for leaf, v in zip(self.leaves, values, strict=True)
                )
        else:
            rep = self.replacement or ()
            if len(rep) != len(values):
                raise InvalidArgumentError(
                    f"layer {self.path!r} produced {len(values)} tensors but {len(rep)} "
                    "replacements were given",
                    argument="layer",
                )
            self.leaves = rep
        # Clones, so in-place operations after the layer (ReLU(inplace=True)) leave the
        # leaves intact; gradients with respect to the leaves are unchanged by the clone.
        return tuple(leaf.clone() for leaf in self.leaves)


class _Graft(torch.autograd.Function):
    """The leaf's value; its gradient goes to the leaf and to the layer's own value alike (an
    autograd function, not ``leaf + (v - v.detach())``, so no rule intercepting additions,
    LRP's, splits it)."""

    @staticmethod
    def forward(ctx: Any, leaf: Tensor, value: Tensor) -> Tensor:
        return leaf.clone()

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, Tensor]:
        return g, g


Nest = Callable[[Tensors], Any]

#: the nested layer structures seen while ``recording`` (keyed by path and side)
_recorded: ContextVar[dict[tuple[str, bool], Nest] | None] = ContextVar(
    "layer_structures", default=None
)


@contextmanager
def recording() -> Iterator[dict[tuple[str, bool], Nest]]:
    """Collect, for each tapped layer whose value nests tuples, how to re-nest its tensors."""
    seen: dict[tuple[str, bool], Nest] = {}
    token = _recorded.set(seen)
    try:
        yield seen
    finally:
        _recorded.reset(token)


def _split(obj: Any) -> tuple[Tensors, Nest]:
    """The tensors in a hook's value, depth first through nested tuples and lists, and how to
    rebuild the value with other tensors in their places (non-tensor items kept)."""
    if isinstance(obj, Tensor):
        return (obj,), lambda ts: ts[0]
    if isinstance(obj, (tuple, list)):
        parts = [_split(v) for v in obj]

        def rebuild(ts: Tensors) -> Any:
            items, i = [], 0
            for sub, (tensors, nest) in zip(obj, parts, strict=True):
                items.append(nest(ts[i : i + len(tensors)]) if tensors else sub)
                i += len(tensors)
            if isinstance(obj, list):
                return items
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)

        return tuple(t for ts, _ in parts for t in ts), rebuild
    return (), lambda ts: obj


def _describe(obj: Any) -> str:
    """A value's structure as messages print it: ``(Tensor, (Tensor, Tensor))``."""
    if isinstance(obj, nn.utils.rnn.PackedSequence):
        return "PackedSequence"
    if isinstance(obj, Tensor):
        return "Tensor"
    if isinstance(obj, (tuple, list)):
        inner = ", ".join(_describe(v) for v in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner}{',' if len(obj) == 1 else ''})"
    return type(obj).__name__


def _packed(obj: Any) -> bool:
    if isinstance(obj, nn.utils.rnn.PackedSequence):
        return True
    return isinstance(obj, (tuple, list)) and any(_packed(v) for v in obj)


def _batch_dims(module: nn.Module, tensors: Tensors) -> list[int]:
    """Where each of the layer's tensors holds the batch. A recurrent module's hidden states
    (h, c; in and out) are (layers, N, H) and its sequence is (T, N, F) unless batch_first;
    everything else is batch-first."""
    dims = [0] * len(tensors)
    if isinstance(module, nn.RNNBase) and tensors and tensors[0].dim() == 3:
        dims = [0 if module.batch_first else 1] + [1] * (len(tensors) - 1)
    return dims


@contextmanager
def tap(
    module: nn.Module,
    path: str,
    *,
    to_input: bool = False,
    mode: TapMode = "read",
    stop: bool = False,
    replacement: Tensors | None = None,
) -> Iterator[Tap]:
    """Hook ``module`` for the duration of the block; the hook is always removed."""
    t = Tap(path=path, to_input=to_input, mode=mode, stop=stop, replacement=replacement)

    side = "received" if to_input else "returned"

    def on_value(value: Any) -> Any:
        if _packed(value):
            raise UnsupportedLayerError(
                f"layer {path!r} {side} {_describe(value)}: packed sequences cannot be "
                "attributed; pick a layer that sees padded tensors",
                argument="layer",
            )
        tensors, rebuild = _split(value)
        if not tensors:
            raise InvalidArgumentError(f"layer {path!r} {side} no tensors", argument="layer")
        if isinstance(value, (tuple, list)) and any(isinstance(v, (tuple, list)) for v in value):
            seen = _recorded.get()
            if seen is not None:
                seen[(path, to_input)] = rebuild
        dims = _batch_dims(module, tensors)
        tensors = tuple(v.transpose(0, 1) if d else v for v, d in zip(tensors, dims, strict=True))
        if t.rows is not None:
            for i, v in enumerate(tensors):
                if v.dim() == 0 or v.shape[0] != t.rows:
                    where = f"dim {dims[i]}" if v.dim() else "no dims"
                    raise UnsupportedLayerError(
                        f"layer {path!r} {side} {_describe(value)} whose tensor {i} "
                        f"({list(v.transpose(0, 1).shape) if dims[i] else list(v.shape)}) "
                        f"has no batch of {t.rows} rows ({where}); layer attribution needs "
                        "every tensor of the layer to carry the batch",
                        argument="layer",
                    )
        # a model run in a low dtype (precision) hands the engine float32 and takes back its own
        low = working_dtype()
        own = None
        if low is not None and any(v.dtype == low for v in tensors):
            own = tuple(v.dtype for v in tensors)
            tensors = tuple(v.float() if v.dtype == low else v for v in tensors)
        new = t._new(tensors)
        if t.stop:
            raise _Stop("layer reached")
        if own is not None:  # even when reading: the gradient must pass the float32 values
            new = tuple(v.to(d) for v, d in zip(tensors if new is None else new, own, strict=True))
        if new is None:
            return None
        return rebuild(tuple(v.transpose(0, 1) if d else v for v, d in zip(new, dims, strict=True)))

    if to_input:
        handle = hooks.hold(module.register_forward_pre_hook, lambda m, args: on_value(args))
    else:
        handle = hooks.hold(module.register_forward_hook, lambda m, args, out: on_value(out))
    try:
        yield t
    finally:
        handle.remove()


def run(forward: Forward, xs: Tensors, t: Tap) -> Tensor | None:
    """Run ``forward`` with ``t`` active; the output, or None when the tap stopped it early."""
    t.reset()
    t.rows = xs[0].shape[0] if xs and xs[0].dim() else None
    try:
        out = forward(xs)
    except _Stop:
        out = None
    if not t.stop or t.calls == 0:
        t.check_ran()
    return out


def layer_gradients(
    forward: Forward,
    xs: Tensors,
    target: Target,
    module: nn.Module,
    path: str,
    to_input: bool,
    replacement: Tensors | None = None,
) -> tuple[Tensors, Tensors, Tensor]:
    """d(targeted output)/d(layer), the layer's own values, and the targeted outputs.

    With ``replacement`` the layer's values are replaced by it (and the gradient is with
    respect to it): layer integrated gradients' activation swap.
    """
    mode: TapMode = "cut" if replacement is None else "swap"
    with (
        torch.enable_grad(),
        tap(module, path, to_input=to_input, mode=mode, replacement=replacement) as t,
    ):
        out = run(forward, xs, t)
        selected = target.select(out)  # type: ignore[arg-type]  # a "cut"/"swap" tap never stops
        leaves = t.leaves
        wanted = [leaf for leaf in leaves if leaf.requires_grad]
        if wanted and not selected.requires_grad:
            raise InvalidArgumentError(
                f"the targeted output does not depend on layer {path!r}'s "
                f"{'input' if to_input else 'output'} (no gradient flows back to it); pick a "
                "layer on the path to the output",
                argument="layer",
            )
        forward_done()
        grads = torch.autograd.grad(selected.sum(), wanted, allow_unused=True) if wanted else ()
    it = iter(grads)
    full = tuple((next(it) if leaf.requires_grad else None) for leaf in leaves)
    return (
        tuple(torch.zeros_like(v) if g is None else g for g, v in zip(full, leaves, strict=True)),
        tuple(v.detach() for v in t.values),
        selected.detach(),
    )


def activations(
    forward: Forward, xs: Tensors, module: nn.Module, path: str, to_input: bool
) -> Tensors:
    """The layer's values for ``xs`` (no grad; the forward stops at the layer)."""
    with torch.no_grad(), tap(module, path, to_input=to_input, stop=True) as t:
        run(forward, xs, t)
    return tuple(v.detach() for v in t.values)


def tile(xs: Tensors, k: int) -> Tensors:
    """Each input repeated ``k`` times along dim 0, batch-tiled (step-major, as paths are)."""
    if k == 1:
        return xs
    return tuple(x.repeat((k,) + (1,) * (x.dim() - 1)) for x in xs)


# --- paths in input space, gradients at the layer (internal influence, conductance)


def layer_path(
    call: Any,
    xs: Tensors,
    bs: Tensors,
    alphas: Tensor,
    module: nn.Module,
    path: str,
    to_input: bool,
) -> tuple[Tensors, Tensors, dict[str, Any]]:
    """Layer gradients and values at every point b + alpha_k (x - b), step-major.

    Returns (gradients, values), each of K*N rows in the order (step, example), and the
    chosen ``internal_batch_size``. Steps are chunked as ``path_gradient_sum`` chunks them.
    """
    from methods.engine.batching import run_chunks
    from methods.engine.path import steps_per_chunk

    n, k_total = call.n, int(alphas.shape[0])
    diffs = tuple(x - b for x, b in zip(xs, bs, strict=True))

    def at(sub: Any, points: Tensors) -> tuple[Tensors, Tensors]:
        grads, values, _ = layer_gradients(sub.forward, points, sub.target, module, path, to_input)
        return grads, values

    def chunk(s: int, e: int) -> tuple[Tensors, Tensors]:
        k = e - s
        sub = call.replace(forward=call.forward.expanded(k), target=call.target.expand(k))
        a = alphas[s:e]
        points = tuple(
            (b.unsqueeze(0) + a.view(k, *([1] * d.dim())).to(d.dtype) * d.unsqueeze(0)).reshape(
                k * n, *d.shape[1:]
            )
            for b, d in zip(bs, diffs, strict=True)
        )
        return at(sub, points)

    per = steps_per_chunk(call, k_total, xs, lambda c, pts: at(c, pts)[0])
    parts, used = run_chunks(k_total, per, chunk, retry_oom=call.internal_batch_size == "auto")
    grads = tuple(torch.cat([p[0][i] for p in parts]) for i in range(len(parts[0][0])))
    values = tuple(torch.cat([p[1][i] for p in parts]) for i in range(len(parts[0][1])))
    return grads, values, {"internal_batch_size": used * n}
