"""Occlusion: slide a box over each input, replace it by the baseline, average the output change.

Zeiler & Fergus 2014, https://arxiv.org/abs/1311.2901, with Captum's window placement. Each
element's attribution is the mean output change over the windows covering it. Windows are
separable boxes, so both the batched masks and the final averaging are products of per-dim
coverage tables (no per-window Python loop). The result keeps the output's floating dtype
(Captum divides in float32, so its float64 results are rounded to float32).
"""

from __future__ import annotations

import math
import string

import torch
from pydantic import Field
from torch import Tensor

from methods.cost import CostShape
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.incremental import evaluate_boxes
from methods.engine.inputs import Tensors
from methods.engine.perturb import echo, evaluate_with_initial
from methods.errors import InvalidArgumentError
from methods.params import MethodParams, PositiveInt
from methods.registry import register

Shape = tuple[int, ...]
#: a window's sides, or its strides, per dim: each >= 1
Sizes = tuple[PositiveInt, ...]
#: one input's (dims, window, stride), per non-batch dim
Geometry = tuple[Shape, Shape, Shape]


class OcclusionParams(MethodParams):
    sliding_window_shapes: Sizes | tuple[Sizes, ...] = Field(
        ...,
        description="the occluding box's shape without the batch dim: a tuple of ints for one "
        "input, a tuple of such tuples for several",
    )
    strides: PositiveInt | tuple[PositiveInt | Sizes, ...] | None = Field(
        None,
        description="step between windows: an int, a tuple per dim (one input), or per input an "
        "int or tuple; default 1",
    )


class _Windows:
    """The windows of one input: per-dim coverage tables (shifts_d, size_d)."""

    def __init__(self, dims: Shape, window: Shape, stride: Shape, device: torch.device) -> None:
        self.shifts = tuple(
            math.ceil((d - w) / s) + 1 for d, w, s in zip(dims, window, stride, strict=True)
        )
        self.cover = []
        for d, w, s, n in zip(dims, window, stride, self.shifts, strict=True):
            pos = torch.arange(d, device=device)
            starts = torch.arange(n, device=device).unsqueeze(1) * s
            self.cover.append((pos >= starts) & (pos < starts + w))
        self.count = math.prod(self.shifts)
        self.dims, self.window, self.stride = dims, window, stride

    def extents(self, device: torch.device) -> tuple[Tensor, Tensor]:
        """Every window's box as (lo, hi), each (count, n_dims), in window order."""
        local = torch.arange(self.count, device=device)
        lo, hi = [], []
        for d, n in enumerate(self.shifts):
            start = (local % n) * self.stride[d]
            local = local // n
            lo.append(start)
            hi.append((start + self.window[d]).clamp(max=self.dims[d]))
        return torch.stack(lo, 1), torch.stack(hi, 1)

    def boxes(self, local: Tensor) -> Tensor:
        """Boolean masks (k, *dims) of windows ``local`` (first dim varies fastest, as Captum)."""
        k, nd = local.shape[0], len(self.cover)
        box = torch.ones(k, *([1] * nd), dtype=torch.bool, device=local.device)
        rem = local
        for d, cover in enumerate(self.cover):
            sel = cover[rem % self.shifts[d]]  # (k, size_d)
            rem = rem // self.shifts[d]
            sel = sel.reshape(k, *([1] * d), -1, *([1] * (nd - d - 1)))
            box = box & sel
        return box

    def average(self, diff: Tensor) -> Tensor:
        """diff (windows, n_out) -> (n_out, *dims): mean over the windows covering each element."""
        nd = len(self.cover)
        if nd == 0:  # a batch of scalars: one window, covering each scalar once
            return diff.t().reshape(diff.shape[1])
        letters = string.ascii_letters
        w_idx, p_idx = letters[:nd], letters[nd : 2 * nd]
        # first dim fastest: the row-major window index lists dims last-to-first
        t = diff.t().reshape(diff.shape[1], *reversed(self.shifts))
        t = t.permute(0, *range(nd, 0, -1))
        covers = [c.to(diff.dtype) for c in self.cover]
        spec = f"o{w_idx}," + ",".join(f"{w}{p}" for w, p in zip(w_idx, p_idx, strict=True))
        total = torch.einsum(f"{spec}->o{p_idx}", t, *covers)
        count = torch.ones((1,) * nd, dtype=diff.dtype, device=diff.device)
        for d, c in enumerate(covers):
            count = count * c.sum(0).reshape(*([1] * d), -1, *([1] * (nd - d - 1)))
        return total / count


def _ints(v: object) -> Shape:
    return tuple(int(a) for a in v) if isinstance(v, tuple) else (int(v),)  # type: ignore[call-overload]


def _geometry(dims_per_input: tuple[Shape, ...], p: OcclusionParams) -> list[Geometry]:
    """Per input, (dims, window, stride) from the per-example shapes, checked."""
    n_in = len(dims_per_input)
    sws = p.sliding_window_shapes
    # A tuple of ints is one input's window (Captum's single-input form).
    shapes: tuple[Shape, ...] = (
        (_ints(sws),) if all(isinstance(v, int) for v in sws) else tuple(_ints(v) for v in sws)
    )
    if len(shapes) != n_in:
        raise InvalidArgumentError(
            f"occlusion: sliding_window_shapes gives {len(shapes)} window(s) for {n_in} "
            "inputs; give one tuple per input",
            argument="sliding_window_shapes",
        )
    st_in = p.strides
    strides: tuple[int | Shape, ...]
    if st_in is None or isinstance(st_in, int):
        strides = (1 if st_in is None else st_in,) * n_in
    elif n_in == 1 and all(isinstance(v, int) for v in st_in):
        strides = (_ints(st_in),)
    else:
        strides = st_in
    if len(strides) != n_in:
        raise InvalidArgumentError(
            f"occlusion: strides gives {len(strides)} entries for {n_in} inputs",
            argument="strides",
        )
    out: list[Geometry] = []
    for i, (dims, w, s) in enumerate(zip(dims_per_input, shapes, strides, strict=True)):
        if len(w) != len(dims) or any(v < 1 for v in w):
            raise InvalidArgumentError(
                f"occlusion: sliding_window_shapes[{i}] = {w} must have one positive size per "
                f"non-batch dim of inputs[{i}] {dims}",
                argument="sliding_window_shapes",
            )
        if any(a > b for a, b in zip(w, dims, strict=True)):
            raise InvalidArgumentError(
                f"occlusion: sliding_window_shapes[{i}] = {w} is larger than inputs[{i}] "
                f"{dims} (without the batch dim)",
                argument="sliding_window_shapes",
            )
        st = (s,) * len(dims) if isinstance(s, int) else _ints(s)
        if len(st) != len(dims) or any(v < 1 for v in st):
            raise InvalidArgumentError(
                f"occlusion: strides[{i}] = {s} must be a positive int or one positive int per "
                f"non-batch dim of inputs[{i}] {dims}",
                argument="strides",
            )
        if any(v > a and a != b for v, a, b in zip(st, w, dims, strict=True)):
            raise InvalidArgumentError(
                f"occlusion: strides[{i}] = {st} exceeds the window {w} where the window does "
                "not span the input; elements would be skipped",
                argument="strides",
            )
        out.append((dims, w, st))
    return out


def _windows(xs: Tensors, p: OcclusionParams) -> list[_Windows]:
    dims = tuple(tuple(int(d) for d in x.shape[1:]) for x in xs)
    return [_Windows(*g, device=x.device) for g, x in zip(_geometry(dims, p), xs, strict=True)]


def _cost(p: OcclusionParams, shape: CostShape) -> int:
    """One forward per window position over every input, plus the unoccluded one."""
    return 1 + sum(
        math.prod(math.ceil((d - w) / s) + 1 for d, w, s in zip(*g, strict=True))
        for g in _geometry(shape.input_shapes, p)
    )


@register(
    "occlusion",
    family="perturbation",
    params=OcclusionParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=_cost,
    forward_only=True,
)
def occlusion(call: Call, p: OcclusionParams) -> Output:
    """Mean output change when a sliding box covering each element is set to the baseline."""
    xs = call.inputs
    wins = _windows(xs, p)
    bs = format_baselines(call.baselines, xs)
    offsets = [0]
    for w in wins:
        offsets.append(offsets[-1] + w.count)
    n = call.n

    def build(s: int, e: int) -> Tensors:
        k = e - s
        g = torch.arange(s, e, device=xs[0].device)
        out = []
        for i, (x, b, w) in enumerate(zip(xs, bs, wins, strict=True)):
            local = g - offsets[i]
            valid = (local >= 0) & (local < w.count)
            if not bool(valid.any()):
                out.append(x.unsqueeze(0).expand(k, *x.shape).reshape(k * n, *x.shape[1:]))
                continue
            box = w.boxes(local.clamp(0, w.count - 1))
            box = box & valid.reshape(k, *([1] * (box.dim() - 1)))
            out.append(torch.where(box.unsqueeze(1), b, x).reshape(k * n, *x.shape[1:]))
        return tuple(out)

    total = offsets[-1]
    fast = None
    if len(xs) == 1:
        # Recompute only what each box changes, where the model allows (see incremental).
        fast = evaluate_boxes(call, xs[0], bs[0], *wins[0].extents(xs[0].device))
    ev, initial, occluded = fast or evaluate_with_initial(call, xs, total, build)
    diff = initial.reshape(1, -1) - occluded.reshape(total, -1)
    if not diff.is_floating_point():
        diff = diff.to(torch.get_default_dtype())
    attrs = tuple(w.average(diff[offsets[i] : offsets[i + 1]]) for i, w in enumerate(wins))
    # which path ran: "incremental" recomputes only what each box changes (engine.incremental)
    strategy = "plain" if fast is None else "incremental"
    return Output(attrs, echo={**echo(ev), "strategy": strategy})
