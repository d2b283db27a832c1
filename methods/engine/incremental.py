"""Incremental occlusion: recompute only the part of each activation that a box changes.

Occlusion evaluates the model once per window, yet a window changes only a box of the input,
and through the spatially local layers at the bottom of a CNN (convolutions, pooling,
element-wise activations, eval-mode batch norm, dropout in eval) it changes only a box of each
activation: the box's image under the layer's receptive field. Nakandala et al., "Incremental
and Approximate Inference for Faster Occlusion-based Deep CNN Explanations" (SIGMOD 2019),
showed that recomputing just those boxes, on top of the activations of the unperturbed input,
gives the same outputs for a fraction of the work. This module does that for any model whose
graph (``torch.fx``) starts with a chain of such layers:

- ``local_prefix(model)`` traces the model and splits it into the local chain at its input
  and a ``tail`` graph module taking the chain's output.
- ``evaluate_boxes`` runs the unperturbed batch through the chain once, keeping every
  activation padded the way the next layer pads it; then, for each chunk of boxes, gathers the
  few input rows/columns each changed output box reads (base values with the previous layer's
  new box pasted in), applies the layer to that region only, and finally pastes the last box
  into the base activation and runs the tail on full rows.

Boxes have one fixed size per layer (the largest any window needs, kept inside the tensor), so
a chunk is a handful of batched gathers and one small layer call per layer. Each output value
is computed from exactly the values the full forward would use; only the floating-point
summation order inside a convolution kernel can differ (ulp level).

Models that cannot be replayed op by op (see ``tracing``) or do not start with a local layer
are left to the plain path (``local_prefix`` returns None).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from methods.engine import ops, tracing
from methods.engine.batching import count_saved_bytes
from methods.engine.call import Call
from methods.engine.inputs import Forward
from methods.engine.perturb import Evaluator

Ints = tuple[int, ...]
Index = tuple[slice, ...]
Layer = Callable[[Tensor], Tensor]

# What incremental occlusion can box, from the engine's table of operations: element-wise
# layers and dropout as they are, sliding windows (convolutions, pooling) on boxes.
_POINTWISE_OPS = tuple(op for op in ops.OPS if op.local and op.kind in ("elementwise", "dropout"))
_POINTWISE_MODULES: tuple[type[nn.Module], ...] = tuple(
    m for op in _POINTWISE_OPS for m in op.modules
)
_POINTWISE_FUNCTIONS = frozenset(f for op in _POINTWISE_OPS if op.kind == "elementwise"
                                 for f in op.functions)  # fmt: skip
_POINTWISE_METHODS = frozenset(name for op in _POINTWISE_OPS for name in op.methods)
#: functional pooling calls, rebuilt as their module twins: the module, and the functional's
#: positional parameter names after the input (the orders differ, so arguments pass by name)
_FUNCTIONAL_POOLS: dict[Any, tuple[type[nn.Module], tuple[str, ...]]] = {
    op.functions[0]: (op.modules[0], op.signature)
    for op in ops.OPS
    if op.kind in ("max_pool", "pooling") and op.signature
}


@dataclass(frozen=True)
class _Window:
    """A sliding-window layer on ``nd`` spatial dims, applied to pre-padded regions."""

    kernel: Ints
    stride: Ints
    dilation: Ints
    pad_lo: Ints
    pad_hi: Ints
    pad_value: float
    #: the layer with zero padding, for a region already padded with ``pad_value``
    apply: Layer

    def out_size(self, n_in: Ints) -> Ints:
        return tuple(
            (n + lo + hi - d * (k - 1) - 1) // s + 1
            for n, lo, hi, d, k, s in zip(
                n_in, self.pad_lo, self.pad_hi, self.dilation, self.kernel, self.stride,
                strict=True,
            )
        )  # fmt: skip

    def pad(self, t: Tensor) -> Tensor:
        pads = [v for lo, hi in zip(self.pad_lo, self.pad_hi, strict=True) for v in (lo, hi)]
        if not any(pads):
            return t
        # F.pad lists the last dim first
        flat = [v for i in range(len(self.pad_lo) - 1, -1, -1) for v in pads[2 * i : 2 * i + 2]]
        return F.pad(t, flat, value=self.pad_value)


@dataclass(frozen=True)
class _Op:
    """One layer of the local chain: ``dense`` runs it on whole tensors; ``window`` (None for
    element-wise layers) gives its sliding-window form for the input's spatial size."""

    dense: Layer
    window: Callable[[Ints], _Window | None] | None


@dataclass(frozen=True)
class LocalPrefix:
    ops: tuple[_Op, ...]
    #: the rest of the model: ``tail(chain_output, *additional_forward_args)``
    tail: fx.GraphModule
    #: ``tracing.state`` of the model when traced: what the graph may have baked in
    state: tuple[Any, ...]


def _tuple(v: Any, nd: int) -> Ints:
    return tuple(int(a) for a in v) if isinstance(v, (tuple, list)) else (int(v),) * nd


def _conv(m: nn.Module, op: ops.Op) -> Callable[[Ints], _Window | None] | None:
    nd = op.dims
    if m.padding_mode != "zeros" or getattr(m, "transposed", False):
        return None
    k, d = _tuple(m.kernel_size, nd), _tuple(m.dilation, nd)
    if m.padding == "same":
        total = tuple(di * (ki - 1) for di, ki in zip(d, k, strict=True))
        lo, hi = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    elif m.padding == "valid":
        lo = hi = (0,) * nd
    else:
        lo = hi = _tuple(m.padding, nd)
    fn = op.functions[0]
    w = _Window(
        k, _tuple(m.stride, nd), d, lo, hi, 0.0,
        lambda r: fn(r, m.weight, m.bias, m.stride, 0, m.dilation, m.groups),
    )  # fmt: skip
    return lambda _: w


def _pool(m: nn.Module, op: ops.Op) -> Callable[[Ints], _Window | None] | None:
    nd = op.dims
    if m.ceil_mode or getattr(m, "return_indices", False):
        return None
    k = _tuple(m.kernel_size, nd)
    s = _tuple(m.stride if m.stride is not None else m.kernel_size, nd)
    p = _tuple(m.padding, nd)
    if op.kind == "max_pool":
        fn = op.functions[0]
        d = _tuple(m.dilation, nd)
        w = _Window(k, s, d, p, p, -math.inf, lambda r: fn(r, k, s, 0, d))
    else:
        if any(p) and not m.count_include_pad:
            return None  # edge divisors would count only the real elements
        fn = op.functions[0]
        extra = () if nd == 1 else (m.divisor_override,)
        w = _Window(k, s, (1,) * nd, p, p, 0.0, lambda r: fn(r, k, s, 0, False, True, *extra))
    return lambda _: w


def _adaptive(m: nn.Module, op: ops.Op) -> Callable[[Ints], _Window | None] | None:
    nd = op.dims
    if getattr(m, "return_indices", False):
        return None
    kind = "max" if op.name.startswith("adaptive_max") else "avg"
    fn = ops.BY_NAME[f"{kind}_pool{nd}d"].functions[0]  # the equivalent sliding window
    size = m.output_size if isinstance(m.output_size, (tuple, list)) else (m.output_size,) * nd

    def window(n_in: Ints) -> _Window | None:
        outs = tuple(n if o is None else int(o) for o, n in zip(size, n_in, strict=True))
        if any(o < 1 or n % o for o, n in zip(outs, n_in, strict=True)):
            return None  # uneven bins overlap: not a plain sliding window
        k = tuple(n // o for o, n in zip(outs, n_in, strict=True))
        zero, one = (0,) * nd, (1,) * nd
        return _Window(k, k, one, zero, zero, 0.0, lambda r: fn(r, k, k))

    return window


def _module_op(m: nn.Module) -> _Op | None:
    if isinstance(m, _POINTWISE_MODULES):
        return _Op(m, None)
    if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
        return _Op(m, None)  # eval mode (checked by the caller): a per-channel affine map
    op = ops.of_module(m)
    # sliding windows by exact class: a subclass may compute something else in forward
    if op is None or not op.local or not op.dims or type(m) not in op.modules:
        return None
    make = _conv if op.kind == "weighted" else _adaptive if "adaptive" in op.name else _pool
    window = make(m, op)
    return None if window is None else _Op(m, window)


def _has_node(values: Any) -> bool:
    found = False

    def visit(a: Any) -> Any:
        nonlocal found
        found = found or isinstance(a, fx.Node)
        return a

    fx.node.map_aggregate(values, visit)
    return found


def _node_op(gm: fx.GraphModule, node: fx.Node, src: fx.Node) -> _Op | None:
    """The node as a local layer reading only ``src``, or None."""
    if not node.args or node.args[0] is not src or _has_node((node.args[1:], node.kwargs)):
        return None
    rest, kw = node.args[1:], dict(node.kwargs)
    if node.op == "call_module":
        if rest or kw:
            return None
        return _module_op(gm.get_submodule(str(node.target)))
    if node.op == "call_function" and node.target in _POINTWISE_FUNCTIONS:
        fn: Any = node.target
        return _Op(lambda t: fn(t, *rest, **kw), None)
    if node.op == "call_function" and node.target in _FUNCTIONAL_POOLS:
        cls, names = _FUNCTIONAL_POOLS[node.target]
        if len(rest) > len(names) or set(kw) & set(names[: len(rest)]):
            return None
        try:
            m = cls(**dict(zip(names, rest, strict=False)), **kw)
        except TypeError:
            return None
        return _module_op(m)
    if node.op == "call_method" and node.target in _POINTWISE_METHODS:
        name = str(node.target)
        return _Op(lambda t: getattr(t, name)(*rest, **kw), None)
    return None


def _split(model: nn.Module) -> LocalPrefix | None:
    gm = tracing.trace(model)
    if gm is None:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return None
    node, chain, ops = placeholders[0], [], []
    while len(node.users) == 1:
        user = next(iter(node.users))
        op = _node_op(gm, user, node)
        if op is None:
            break
        chain.append(user)
        ops.append(op)
        node = user
    if not any(op.window is not None for op in ops):
        return None
    graph, env = fx.Graph(), {}
    dropped = {placeholders[0], *chain}
    for n in gm.graph.nodes:
        if n is placeholders[0]:
            env[chain[-1]] = graph.placeholder("activation")
        elif n not in dropped:
            env[n] = graph.node_copy(n, lambda a: env[a])
    return LocalPrefix(tuple(ops), fx.GraphModule(gm, graph), tracing.state(model))


_PREFIXES: tracing.Cache = weakref.WeakKeyDictionary()


def local_prefix(model: Any) -> LocalPrefix | None:
    """The model's local chain and tail, or None when the plain path must be used.

    The trace is kept per model (tracing patches ``nn.Module.__call__`` process-wide for its
    duration, so it should be rare) and redone when anything the graph may have baked in
    changes: a submodule, a flag or threshold attribute, a replaced tensor. ``evaluate_boxes``
    also checks the traced graph's output against the model's own."""
    prefix = tracing.analysed(_PREFIXES, model, _split)
    if prefix is not None and prefix.state != tracing.state(model):
        _PREFIXES.pop(model, None)
        prefix = tracing.analysed(_PREFIXES, model, _split)
    return prefix


@dataclass(frozen=True)
class _Step:
    """A window layer on the boxes: window ``j``'s output box starts at ``lo[j]``."""

    window: _Window
    padded: Tensor  # the layer's base input, padded as the layer pads it: (N, C, *S + pads)
    lo: list[list[int]]
    size: Ints

    @property
    def reach(self) -> Ints:
        """The input extent an output box reads."""
        w = self.window
        return tuple(
            (n - 1) * s + d * (k - 1) + 1
            for n, s, d, k in zip(self.size, w.stride, w.dilation, w.kernel, strict=True)
        )


def _fit(lo: Tensor, hi: Tensor, extent: Ints) -> tuple[Tensor, Ints]:
    """One box size per dim (the largest needed) and starts moved to keep boxes inside."""
    size = tuple(
        max(1, min(int((hi[:, d] - lo[:, d]).max()), extent[d])) for d in range(len(extent))
    )
    top = torch.tensor([e - s for e, s in zip(extent, size, strict=True)])
    return torch.minimum(lo.clamp(min=0), top), size


def _box(start: list[int], size: Ints) -> Index:
    """Index of a box over the spatial dims of an (N, C, *S) tensor."""
    return (slice(None), slice(None), *(slice(a, a + n) for a, n in zip(start, size, strict=True)))


def _overlap(rel: list[int], size: Ints, reach: Ints) -> tuple[Index, Index] | None:
    """Where a box of ``size`` placed at ``rel`` inside a region of ``reach`` overlaps it:
    (index into the region, index into the box), or None. A box can stick out of a region
    (parts no output of the layer reads)."""
    into, out = [slice(None), slice(None)], [slice(None), slice(None)]
    for r, n, m in zip(rel, size, reach, strict=True):
        a, b = max(r, 0), min(r + n, m)
        if a >= b:
            return None
        into.append(slice(a, b))
        out.append(slice(a - r, b - r))
    return tuple(into), tuple(out)


class _Plan:
    """Per call: the base activations and every layer's box for every window.

    Work is per window with plain slices: the N examples of a window share its geometry, so
    each crop and paste is one strided copy, far cheaper than element-wise gathers.
    """

    def __init__(
        self, prefix: LocalPrefix, x: Tensor, baseline: Tensor, lo: Tensor, hi: Tensor
    ) -> None:
        self.x, self.baseline, self.n = x, baseline, int(x.shape[0])
        # the windows (W, D) over every non-batch dim, channel first
        self.win_lo, self.win_hi = lo.tolist(), hi.tolist()
        lo, hi = lo.cpu(), hi.cpu()
        nd = x.dim() - 2
        box = _fit(lo[:, 1:], hi[:, 1:], tuple(x.shape[2:]))
        self.box0 = (box[0].tolist(), box[1])
        self.steps: list[_Step | None] = []  # per layer before the split; None: element-wise
        split: int | None = None
        t = x.clone()  # in-place activations must not touch the caller's input
        for i, op in enumerate(prefix.ops):
            if split is None:
                if op.window is None:
                    self.steps.append(None)
                else:
                    spatial = tuple(t.shape[2:])
                    w = op.window(spatial) if t.dim() == nd + 2 else None
                    out = w.out_size(spatial) if w is not None else ()
                    nbox = _propagate(w, *box, out) if w is not None else None
                    if w is None or nbox is None or nbox[1] == out:
                        split = i  # not a sliding window here, or the box covers everything
                    else:
                        self.steps.append(_Step(w, w.pad(t), nbox[0].tolist(), nbox[1]))
                        box = nbox
                if split == i:
                    self.at_split = t.clone()  # later in-place layers must not touch it
            t = op.dense(t)
        if split is None:
            split, self.at_split = len(prefix.ops), t
        self.ops, self.split = prefix.ops, split
        self.chain_output = t

    @property
    def worthwhile(self) -> bool:
        return any(s is not None for s in self.steps)

    def bytes_per_perturbation(self) -> int:
        """What one window's N rows hold in ``rows``: every region and box."""
        per_row = math.prod(self.box0[1]) * int(self.x.shape[1])
        for s in self.steps:
            if s is not None:
                per_row += (math.prod(s.reach) + math.prod(s.size)) * int(s.padded.shape[1])
        per_row += self.at_split[0].numel() * 2 + self.chain_output[0].numel()
        return per_row * self.n * self.x.element_size()

    def rows(self, s: int, e: int) -> Tensor:
        """The chain's output for windows s..e-1, row ``j * N + n`` (as the plain path)."""
        k, n = e - s, self.n
        size = self.box0[1]
        # The occluded input on each window's first box, all channels.
        box = torch.stack([self.x[_box(self.box0[0][j], size)] for j in range(s, e)])
        for j in range(s, e):
            lo, hi, at = self.win_lo[j], self.win_hi[j], self.box0[0][j]
            spans = list(zip(lo[1:], hi[1:], at, strict=True))
            window = (slice(None), slice(lo[0], hi[0]))
            inside = (*window, *(slice(a - o, b - o) for a, b, o in spans))
            box[j - s][inside] = self.baseline[(*window, *(slice(a, b) for a, b, _ in spans))]
        lo_of = self.box0[0]
        for op, step in zip(self.ops[: self.split], self.steps, strict=True):
            flat = box.reshape(k * n, *box.shape[2:])
            if step is None:
                box = op.dense(flat).reshape(k, n, *box.shape[2:])
                continue
            w, reach = step.window, step.reach
            starts = [
                [a * st for a, st in zip(step.lo[j], w.stride, strict=True)] for j in range(s, e)
            ]
            region = torch.stack([step.padded[_box(r0, reach)] for r0 in starts])
            for j, r0 in zip(range(s, e), starts, strict=True):
                rel = [a + p - b for a, p, b in zip(lo_of[j], w.pad_lo, r0, strict=True)]
                where = _overlap(rel, size, reach)
                if where is not None:
                    region[j - s][where[0]] = box[j - s][where[1]]
            out = w.apply(region.reshape(k * n, *region.shape[2:]))
            box, lo_of, size = out.reshape(k, n, *out.shape[1:]), step.lo, step.size
        full = self.at_split.unsqueeze(0).repeat(k, *([1] * self.at_split.dim()))
        for j in range(s, e):
            full[j - s][_box(lo_of[j], size)] = box[j - s]
        full = full.reshape(k * n, *full.shape[2:])
        for op in self.ops[self.split :]:
            full = op.dense(full)
        return full


def _propagate(w: _Window, lo: Tensor, size: Ints, out: Ints) -> tuple[Tensor, Ints] | None:
    """The output box of layer ``w`` that the input box (``lo``, ``size``) can change."""
    span = torch.tensor([d * (k - 1) for d, k in zip(w.dilation, w.kernel, strict=True)])
    pad, stride = torch.tensor(w.pad_lo), torch.tensor(w.stride)
    hi = lo + torch.tensor(size)
    o_lo = -torch.div(span - lo - pad, stride, rounding_mode="floor")  # ceil((lo+pad-span)/s)
    o_hi = torch.div(hi - 1 + pad, stride, rounding_mode="floor") + 1
    return _fit(o_lo.clamp(min=0), torch.minimum(o_hi, torch.tensor(out)), out)


def evaluate_boxes(
    call: Call, x: Tensor, baseline: Tensor, lo: Tensor, hi: Tensor
) -> tuple[Evaluator, Tensor, Tensor] | None:
    """Targeted outputs with, for each box ``w``, ``x[:, lo[w]:hi[w]]`` (over every non-batch
    dim) replaced by ``baseline``; as ``perturb.evaluate_with_initial``: the evaluator, f(x)
    and the (W, *out_shape) outputs. None when the model has no local chain worth using."""
    fn = call.forward.fn
    direct = fn is call.model
    if not direct or not x.is_floating_point() or x.dim() < 3:
        return None
    prefix = local_prefix(call.model)
    if prefix is None:
        return None
    with torch.no_grad():
        plan = _Plan(prefix, x, baseline, lo, hi)
    if not plan.worthwhile:
        return None
    tail = call.replace(forward=Forward(prefix.tail, call.forward.args))
    # A clone of a leaf, so that a tail starting in place (Flatten, ReLU(inplace=True)) runs.
    leaf = plan.chain_output.detach().requires_grad_(True)
    with torch.enable_grad():
        initial, tail_bytes = count_saved_bytes(
            lambda: tail.target.select_rows(tail.forward((leaf.clone(),)))
        )
    initial = initial.detach()
    initial = initial.reshape(1) if initial.dim() == 0 else initial
    with torch.no_grad():
        own = call.target.select_rows(call.forward((x.clone(),)))  # the caller's x stays as is
    if not torch.equal(initial, own.reshape(1) if own.dim() == 0 else own):
        return None  # the graph is not the model's function after all: take the plain path
    ev = Evaluator(
        call=tail,
        out_shape=tuple(initial.shape),
        per_example=initial.dim() >= 1 and int(initial.shape[0]) == call.n,
        perturbation_bytes=max(1, plan.bytes_per_perturbation() + tail_bytes),
    )
    with torch.no_grad():
        outputs = ev.run(int(lo.shape[0]), lambda s, e: (plan.rows(s, e),))
    return ev, initial, outputs
