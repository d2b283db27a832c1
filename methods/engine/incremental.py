"""Incremental occlusion: recompute only the part of each activation that a box changes.

Occlusion evaluates the model once per window, yet a window changes only a box of the input,
and through the spatially local layers at the bottom of a CNN (convolutions, pooling,
element-wise activations, eval-mode batch norm, residual sums, concatenations along
channels) it changes only a box of each
activation: the box's image under the layer's receptive field. Nakandala et al., "Incremental
and Approximate Inference for Faster Occlusion-based Deep CNN Explanations" (SIGMOD 2019),
showed that recomputing just those boxes, on top of the activations of the unperturbed input,
gives the same outputs for a fraction of the work. This module does that for any model whose
graph (``torch.fx``) starts with such layers (``local_ops``), chained or branching and joining
again as in a ResNet:

- ``local_graph(model, x)`` traces the model (with ``x``'s shape when the forward branches on
  shapes, as Hugging Face models do) and finds the local layers at its input and the *cuts*
  among them: activations that carry everything the rest of the model reads.
- ``evaluate_boxes`` runs the unperturbed batch through the local layers once, keeping what
  the boxes are pasted into (each window layer's input padded as the layer pads it, the
  operands of sums); picks the last cut whose box does not yet cover the whole activation;
  then, for each chunk of windows, computes every layer on its box only (a window layer on
  the few input rows/columns its box reads, a sum on the union of its operands' boxes),
  pastes the cut's box into its base activation and runs the rest of the model (the tail)
  on full rows.

Boxes have one fixed size per layer (the largest any window needs, kept inside the tensor),
so a chunk is a handful of batched copies and one small layer call per layer. Each output
value is computed from exactly the values the full forward would use; only the
floating-point summation order inside a convolution kernel can differ (ulp level). On a
ResNet-50 at 224 px, a 16 px window's box stays below the full activation up to the third
stage, which spares about 40% of each window's forward.

Models that cannot be replayed op by op (see ``tracing``) or do not start with a local
window layer are left to the plain path (``local_graph`` returns None).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, fx

from methods.engine import tracing
from methods.engine.batching import count_saved_bytes
from methods.engine.call import Call
from methods.engine.inputs import Forward
from methods.engine.local_ops import Combine, Ints, LocalOp, Window, binary, concatenated, unary
from methods.engine.perturb import Evaluator

#: Devices where occlusion takes this path. On a CPU it spares about 60% of a ResNet-50's
#: time. On a GPU each window's crops and pastes are kernel launches (about two per window
#: and layer: ~20k for ResNet-50's 196 windows), which may cost more than the batched full
#: forwards they replace (0.1 s for four images on an H200); until ``make gpu-check`` (its
#: "incremental occlusion" row times both) shows it pays, CUDA takes the plain path.
DEVICES: set[str] = {"cpu"}

Index = tuple[slice, ...]
Box = tuple[Tensor, Ints]  # per window its start (W, D), and one size


@dataclass(frozen=True)
class _Node:
    """A local layer: its inputs' positions (0 is the model's input), and either a layer
    of one input or a join of several: an element-wise combination of two, or a
    concatenation along ``cat`` (which must be the channel dim)."""

    args: tuple[int, ...]
    op: LocalOp | None = None
    combine: Combine | None = None
    cat: int | None = None

    def joins(self, ins: list[Tensor]) -> bool:
        """Whether the join of ``ins`` (N, C, *S) is local: the same shapes element-wise, a
        concatenation along channels of tensors alike in every other dim."""
        if self.cat is None:
            return ins[0].shape == ins[1].shape
        return self.cat % ins[0].dim() == 1 and all(
            t.dim() == ins[0].dim() and t.shape[2:] == ins[0].shape[2:] for t in ins
        )

    def join(self, ins: list[Tensor]) -> Tensor:
        if self.cat is None:
            return self.combine(*ins)  # type: ignore[misc]
        return torch.cat(ins, 1)


@dataclass
class LocalGraph:
    """The local layers at a model's input, in graph order, and the cuts among them."""

    nodes: tuple[_Node, ...]
    #: positions whose activation is all that the rest of the model reads of the input
    cuts: frozenset[int]
    gm: fx.GraphModule
    fx_nodes: tuple[fx.Node, ...]
    _tails: dict[int, fx.GraphModule] = field(default_factory=dict)

    def tail(self, cut: int) -> fx.GraphModule:
        """The rest of the model after ``cut``: ``tail(activation, *additional_forward_args)``."""
        if cut not in self._tails:
            graph, env = fx.Graph(), {}
            dropped = set(self.fx_nodes[: cut + 1])
            for n in self.gm.graph.nodes:
                if n is self.fx_nodes[0]:
                    env[self.fx_nodes[cut]] = graph.placeholder("activation")
                elif n not in dropped:
                    env[n] = graph.node_copy(n, lambda a: env[a])
            self._tails[cut] = fx.GraphModule(self.gm, graph)
        return self._tails[cut]


def _analyse(gm: fx.GraphModule | None) -> LocalGraph | None:
    if gm is None:
        return None
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not placeholders:
        return None
    pos = {placeholders[0]: 0}
    fx_nodes, nodes, cuts = [placeholders[0]], [_Node(())], set()
    # local activations some reader of which is still to come
    open_ = {placeholders[0]: set(placeholders[0].users)}
    windows = False
    for n in gm.graph.nodes:
        reads = n.all_input_nodes
        if n in pos or not any(a in pos for a in reads):
            continue  # not computed from the input: it stays with the tail
        node = None
        op = unary(gm, n, reads[0]) if len(reads) == 1 else None
        if op is not None:
            node = _Node((pos[reads[0]],), op=op)
        elif all(a in pos for a in reads):
            if (fn := binary(gm, n)) is not None:
                node = _Node(tuple(pos[a] for a in n.args if isinstance(a, fx.Node)), combine=fn)
            elif (cat := concatenated(n)) is not None:
                node = _Node(tuple(pos[a] for a in cat[0]), cat=cat[1])
        if node is None:
            break
        pos[n] = len(nodes)
        nodes.append(node)
        fx_nodes.append(n)
        for a in reads:
            open_[a].discard(n)
            if not open_[a]:
                del open_[a]
        if n.users:
            open_[n] = set(n.users)
        windows = windows or (node.op is not None and node.op.window is not None)
        if windows and set(open_) == {n}:
            cuts.add(pos[n])
    if not cuts:
        return None
    return LocalGraph(tuple(nodes), frozenset(cuts), gm, tuple(fx_nodes))


@dataclass
class _Traces:
    """A model's local graph: one for every input shape when it traces without one, else
    one per input shape seen (the last few)."""

    state: tuple[Any, ...]
    generic: bool
    graph: LocalGraph | None
    by_shape: dict[tuple[Any, ...], LocalGraph | None] = field(default_factory=dict)


def _traces(model: Any) -> _Traces:
    gm = tracing.trace(model)
    return _Traces(tracing.state(model), gm is not None, _analyse(gm))


_GRAPHS: tracing.Cache = weakref.WeakKeyDictionary()
_SHAPES_KEPT = 4


def local_graph(model: Any, x: Tensor) -> LocalGraph | None:
    """The model's local layers for input ``x``, or None when the plain path must be used.

    The trace is kept per model (tracing patches ``nn.Module.__call__`` process-wide for its
    duration, so it should be rare) and redone when anything the graph may have baked in
    changes: a submodule, a flag or threshold attribute, a replaced tensor. ``evaluate_boxes``
    also checks the traced graph's output against the model's own."""
    traces = tracing.analysed(_GRAPHS, model, _traces)
    if traces is not None and traces.state != tracing.state(model):
        _GRAPHS.pop(model, None)
        traces = tracing.analysed(_GRAPHS, model, _traces)
    if traces is None:
        return None
    if traces.generic:
        return traces.graph
    key = (tuple(x.shape), x.dtype, x.device.type)
    if key not in traces.by_shape:
        if len(traces.by_shape) >= _SHAPES_KEPT:
            traces.by_shape.pop(next(iter(traces.by_shape)))
        traces.by_shape[key] = _analyse(tracing.trace_at(model, x))
    return traces.by_shape[key]


class _Plan:
    """Per call: the base activations and every layer's box for every window.

    Work is per window with plain slices: the N examples of a window share its geometry, so
    each crop and paste is one strided copy, far cheaper than element-wise gathers.
    """

    def __init__(
        self, graph: LocalGraph, x: Tensor, baseline: Tensor, lo: Tensor, hi: Tensor
    ) -> None:
        self.graph, self.x, self.baseline, self.n = graph, x, baseline, int(x.shape[0])
        # the windows (W, D) over every non-batch dim, channel first
        self.win_lo, self.win_hi = lo.tolist(), hi.tolist()
        lo, hi = lo.cpu(), hi.cpu()
        nd = x.dim() - 2
        boxes: list[Box] = [_fit(lo[:, 1:], hi[:, 1:], tuple(x.shape[2:]))]
        nodes = graph.nodes
        self.last_read = {a: i for i, node in enumerate(nodes) for a in node.args}
        self.windows: dict[int, tuple[Window, Tensor]] = {}  # layer -> its base input, padded
        self.base: dict[int, Tensor] = {}  # operands of sums whose box grows into the union
        self.channels = [int(x.shape[1])]
        # the layer the tail starts from; 0 (the input, never a cut): none worth boxing
        self.cut, self.at_cut = 0, x
        values = {0: x.clone()}  # in-place layers must not touch the caller's input
        for i in range(1, len(nodes)):
            node = nodes[i]
            ins = [values[a] for a in node.args]
            if any(t.dim() != nd + 2 for t in ins):
                break
            if node.op is None:
                if not node.joins(ins):
                    break  # broadcasting, or not along channels
                box = _union([boxes[a] for a in node.args], tuple(ins[0].shape[2:]))
                for a in node.args:
                    if not _same(boxes[a], box):
                        self.base[a] = values[a]
                value = node.join(ins)
            elif node.op.window is not None:
                spatial = tuple(ins[0].shape[2:])
                w = node.op.window(spatial)
                if w is None:
                    break
                box = _propagate(w, *boxes[node.args[0]], w.out_size(spatial))
                self.windows[i] = (w, w.pad(ins[0]))
                value = node.op.dense(ins[0])
            else:
                box = boxes[node.args[0]]
                value = node.op.dense(ins[0])
                if value.shape != ins[0].shape:
                    break
            boxes.append(box)
            self.channels.append(int(value.shape[1]))
            values[i] = value
            if i in graph.cuts:
                if box[1] == tuple(value.shape[2:]):
                    break  # the box covers everything from here on
                self.cut, self.at_cut = i, value.clone()  # later in-place layers may write it
            for a in node.args:
                if self.last_read[a] == i:
                    values.pop(a, None)
        # what no layer up to the cut reads (the base pass ran on to find the cut) is let go
        self.windows = {i: w for i, w in self.windows.items() if i <= self.cut}
        self.base = {i: b for i, b in self.base.items() if i <= self.cut}
        self.lo = [b[0].tolist() for b in boxes]
        self.size = [b[1] for b in boxes]

    def bytes_per_perturbation(self) -> int:
        """What one window's N rows hold in ``rows``, at most: every region and box."""
        per_row = 0
        for i in range(self.cut + 1):
            per_row += math.prod(self.size[i]) * self.channels[i] * (2 if i in self.base else 1)
            if i in self.windows:
                w, padded = self.windows[i]
                per_row += math.prod(_reach(w, self.size[i])) * int(padded.shape[1])
        per_row += self.at_cut[0].numel() * 2
        return per_row * self.n * self.x.element_size()

    def rows(self, s: int, e: int) -> Tensor:
        """The cut's activation for windows s..e-1, row ``j * N + n`` (as the plain path)."""
        k, n = e - s, self.n
        size = self.size[0]
        # The occluded input on each window's first box, all channels.
        box = torch.stack([self.x[_box(self.lo[0][j], size)] for j in range(s, e)])
        for j in range(s, e):
            lo, hi, at = self.win_lo[j], self.win_hi[j], self.lo[0][j]
            spans = list(zip(lo[1:], hi[1:], at, strict=True))
            window = (slice(None), slice(lo[0], hi[0]))
            inside = (*window, *(slice(a - o, b - o) for a, b, o in spans))
            box[j - s][inside] = self.baseline[(*window, *(slice(a, b) for a, b, _ in spans))]
        held = {0: box}
        for i in range(1, self.cut + 1):
            node = self.graph.nodes[i]
            if node.op is None:
                parts = [self._grown(a, held[a], i, s, e) for a in node.args]
                flat = node.join([p.reshape(k * n, *p.shape[2:]) for p in parts])
                out = flat.reshape(k, n, *flat.shape[1:])
            else:
                t = held[node.args[0]]
                if i in self.windows:
                    t = self._region(i, t, s, e)
                    apply = self.windows[i][0].apply
                else:
                    apply = node.op.dense
                flat = apply(t.reshape(k * n, *t.shape[2:]))
                out = flat.reshape(k, n, *flat.shape[1:])
            held[i] = out
            for a in node.args:
                if self.last_read[a] == i:
                    held.pop(a, None)
        cut = self.at_cut
        full = cut.unsqueeze(0).repeat(k, *([1] * cut.dim()))
        for j in range(s, e):
            full[j - s][_box(self.lo[self.cut][j], self.size[self.cut])] = held[self.cut][j - s]
        return full.reshape(k * n, *full.shape[2:])

    def _region(self, i: int, t: Tensor, s: int, e: int) -> Tensor:
        """What window layer ``i`` reads for each window's output box: its padded base input
        with the input's box (``t``) pasted in."""
        w, padded = self.windows[i]
        a = self.graph.nodes[i].args[0]
        reach = _reach(w, self.size[i])
        starts = [[o * st for o, st in zip(self.lo[i][j], w.stride, strict=True)]
                  for j in range(s, e)]  # fmt: skip
        region = torch.stack([padded[_box(r0, reach)] for r0 in starts])
        for j, r0 in zip(range(s, e), starts, strict=True):
            rel = [b + p - r for b, p, r in zip(self.lo[a][j], w.pad_lo, r0, strict=True)]
            where = _overlap(rel, self.size[a], reach)
            if where is not None:
                region[j - s][where[0]] = t[j - s][where[1]]
        return region

    def _grown(self, a: int, t: Tensor, i: int, s: int, e: int) -> Tensor:
        """Operand ``a``'s box ``t`` grown to sum ``i``'s box (base values around it)."""
        if a not in self.base:
            return t
        size = self.size[i]
        out = torch.stack([self.base[a][_box(self.lo[i][j], size)] for j in range(s, e)])
        for j in range(s, e):
            rel = [b - o for b, o in zip(self.lo[a][j], self.lo[i][j], strict=True)]
            where = _overlap(rel, self.size[a], size)
            if where is not None:
                out[j - s][where[0]] = t[j - s][where[1]]
        return out


def _reach(w: Window, size: Ints) -> Ints:
    """The input extent an output box of ``size`` reads."""
    return tuple(
        (n - 1) * s + d * (k - 1) + 1
        for n, s, d, k in zip(size, w.stride, w.dilation, w.kernel, strict=True)
    )


def _same(a: Box, b: Box) -> bool:
    return a[1] == b[1] and torch.equal(a[0], b[0])


def _union(boxes: list[Box], extent: Ints) -> Box:
    """Per window, the smallest box holding all of ``boxes``."""
    lo = torch.stack([b[0] for b in boxes]).amin(0)
    hi = torch.stack([b[0] + torch.tensor(b[1]) for b in boxes]).amax(0)
    return _fit(lo, hi, extent)


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


def _propagate(w: Window, lo: Tensor, size: Ints, out: Ints) -> Box:
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
    and the (W, *out_shape) outputs. None when the model has no local layers worth using."""
    fn = call.forward.fn
    direct = fn is call.model
    if not direct or not x.is_floating_point() or x.dim() < 3 or x.device.type not in DEVICES:
        return None
    try:
        graph = local_graph(call.model, x)
        if graph is None:
            return None
        with torch.no_grad():
            plan = _Plan(graph, x, baseline, lo, hi)
    except Exception:  # a layer the analysis did not foresee: the plain path is always right
        return None
    if not plan.cut:
        return None
    tail = call.replace(
        forward=Forward(
            graph.tail(plan.cut),
            call.forward.args,
            output=call.forward.output,
            independent=call.forward.independent,
        )
    )
    # A clone of a leaf, so that a tail starting in place (Flatten, ReLU(inplace=True)) runs.
    leaf = plan.at_cut.detach().requires_grad_(True)
    with torch.enable_grad():
        initial, tail_saved = count_saved_bytes(
            lambda: tail.target.select_rows(tail.forward((leaf.clone(),))), keep=False
        )
    initial = initial.detach()
    initial = initial.reshape(1) if initial.dim() == 0 else initial
    # the model's own forward in the layout the analysis ran in (a channels-last one sums in
    # another order), on a copy: the caller's x stays as is
    as_given = dataclasses.replace(call.forward, channels_last=False)
    with torch.no_grad():
        own = call.target.select_rows(as_given((x.clone(),)))
    if not torch.equal(initial, own.reshape(1) if own.dim() == 0 else own):
        return None  # the graph is not the model's function after all: take the plain path
    ev = Evaluator(
        call=tail,
        out_shape=tuple(initial.shape),
        per_example=initial.dim() >= 1 and int(initial.shape[0]) == call.n,
        perturbation_bytes=max(1, plan.bytes_per_perturbation() + tail_saved.nbytes),
        # The boxes are small and the tail starts at the cut, its largest activation in a
        # CNN whose maps shrink as channels grow: ResNet-50's cut (1024x14x14) gives 20
        # windows a chunk at 49 ms each where the all-activations count gave 1 at 64 ms.
        working_bytes=max(1, plan.at_cut[0].numel() * plan.at_cut.element_size() * call.n),
    )
    with torch.no_grad():
        outputs = ev.run(int(lo.shape[0]), lambda s, e: (plan.rows(s, e),))
    return ev, initial, outputs
