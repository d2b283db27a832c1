"""Weighted sums of gradients along the straight path from baselines to inputs.

The core of integrated gradients and its relatives: for points alpha_k with weights w_k it
returns sum_k w_k * grad f(b + alpha_k (x - b)), evaluating all N x K path points in as few
batched forward+backward passes as the batch-size policy allows, step-major as Captum does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from methods.engine.batching import (
    measured_once,
    row_bytes_estimate,
    rows_per_chunk,
    run_chunks,
)
from methods.engine.call import Call
from methods.engine.gradients import gradients
from methods.engine.inputs import Tensors


class GradFn(Protocol):
    """The gradients at a batch of points, and the targeted outputs there (None where the
    function has no targeted output, as a neuron's). With ``ends`` the batch's last 2N rows
    are its endpoints (a layer's values at the inputs, then at the baselines), to be run on
    the model inputs they came from."""

    def __call__(
        self, call: Call, points: Tensors, ends: Ends | None = None, /
    ) -> tuple[Tensors, Tensor | None]: ...


#: devices where a pass costs its kernel launches more than its rows: there f(inputs) and
#: f(baselines) ride in the path's first pass as 2N more rows (their gradients unused)
#: instead of a forward of their own. On an H200, BERT-base layer IG in bfloat16 spent ~a
#: third of its 19 ms launching the endpoints' forward; on a CPU those rows' backward costs
#: more than the forward it spares
ENDS_IN_PATH = {"cuda"}


def plain_gradients(
    call: Call, points: Tensors, ends: Ends | None = None
) -> tuple[Tensors, Tensor | None]:
    return gradients(call.forward, points, call.target)  # the points are the model's inputs


@dataclass
class Ends:
    """The path's endpoints in its own space (the inputs and baselines, or a layer's values
    at them), to be evaluated with the path's first chunk; ``fx``, ``fb`` are the targeted
    outputs there once it has run."""

    xs: Tensors
    bs: Tensors
    fx: Tensor | None = None
    fb: Tensor | None = None

    @staticmethod
    def wanted(call: Call, device: torch.device) -> bool:
        """Whether this call's endpoints should ride in the path's pass."""
        return call.return_delta and device.type in ENDS_IN_PATH

    def outputs(self) -> tuple[Tensor, Tensor]:
        if self.fx is None or self.fb is None:
            raise RuntimeError("the path's pass has not evaluated its endpoints")
        return self.fx, self.fb


def steps_per_chunk(call: Call, n_steps: int, probe_points: Tensors, grad_fn: GradFn) -> int:
    """How many steps (each N rows) go into one forward+backward."""
    n = call.n
    spec = call.internal_batch_size
    if spec is None:
        return n_steps
    if spec == "auto":
        extra = sum(p[0].numel() * p.element_size() for p in probe_points) * 2
        rows = rows_per_chunk(
            "auto",
            n_steps * n,
            measured_once(
                call.model,
                call.shape_key("path"),
                lambda: row_bytes_estimate(lambda: grad_fn(call, probe_points)[0], n, extra),
                call.shape_family("path"),
            ),
            granule=n,
            device=probe_points[0].device,
        )
        return max(1, rows // n)
    return max(1, int(spec) // n)  # Captum: steps per batch = max(1, ibs // N)


def path_gradient_sum(
    call: Call,
    xs: Tensors,
    bs: Tensors,
    alphas: Tensor,
    weights: Tensor | None,
    grad_fn: GradFn = plain_gradients,
    per_chunk: int | None = None,
    ends: Ends | None = None,
) -> tuple[Tensors, dict[str, Any]]:
    """sum_k weights[k] * grad at b + alphas[k] * (x - b), per input; plus what was chosen.

    ``weights`` None: the gradient at every point instead, each input's with a leading dim K
    (n_steps="auto" keeps them to weigh them again at the next rung). ``ends`` not yet
    evaluated: its rows join the first chunk and its outputs are filled in."""
    n_steps = int(alphas.shape[0])
    n = call.n
    diffs = tuple(x - b for x, b in zip(xs, bs, strict=True))
    if per_chunk is None:
        per_chunk = steps_per_chunk(call, n_steps, xs, grad_fn)
    expanded: dict[int, Call] = {}

    def chunk(s: int, e: int) -> Tensors:
        k = e - s
        extra = 2 if ends is not None and ends.fx is None else 0
        sub = expanded.get(k + extra)
        if sub is None:
            kk = k + extra
            sub = call.replace(forward=call.forward.expanded(kk), target=call.target.expand(kk))
            expanded[kk] = sub
        a = alphas[s:e]
        points = tuple(
            (b.unsqueeze(0) + a.view(k, *([1] * d.dim())).to(d.dtype) * d.unsqueeze(0)).reshape(
                k * n, *d.shape[1:]
            )
            for b, d in zip(bs, diffs, strict=True)
        )
        if ends is not None and extra:
            points = tuple(
                torch.cat([pt, x.to(pt.dtype), b.to(pt.dtype)])
                for pt, x, b in zip(points, ends.xs, ends.bs, strict=True)
            )
        grads, selected = grad_fn(sub, points, ends) if extra else grad_fn(sub, points)
        if ends is not None and extra:
            if selected is None:
                raise RuntimeError("this gradient function gives no outputs for the endpoints")
            grads = tuple(g[: k * n] for g in grads)
            ends.fx, ends.fb = selected[k * n : (k + 1) * n], selected[(k + 1) * n :]
        if weights is None:  # the gradient at each point: (k, N, ...) per input
            return tuple(g.reshape(k, *d.shape) for g, d in zip(grads, diffs, strict=True))
        w = weights[s:e]
        return tuple(
            torch.tensordot(w.to(g.dtype), g.reshape(k, -1), dims=1).reshape(d.shape)
            for g, d in zip(grads, diffs, strict=True)
        )

    retry = call.internal_batch_size == "auto"
    if weights is None:
        parts, used = run_chunks(n_steps, per_chunk, chunk, retry_oom=retry)
        per_point = tuple(torch.cat(each) for each in zip(*parts, strict=True))
        return per_point, {"internal_batch_size": used * n}
    total, used = run_chunks(n_steps, per_chunk, chunk, retry_oom=retry, reduce=add_each)
    return total, {"internal_batch_size": used * n}


def add_each(total: Tensors, part: Tensors) -> Tensors:
    """Per-input sums, in the order Captum adds its chunks (bit-identical to summing a list)."""
    return tuple(t + q for t, q in zip(total, part, strict=True))


def endpoint_outputs(call: Call, xs: Tensors, bs: Tensors) -> tuple[Tensor, Tensor]:
    """Targeted f(x) and f(b), shape (N,) each, from one forward over both."""
    both = tuple(torch.cat([x, b]) for x, b in zip(xs, bs, strict=True))
    with torch.no_grad():
        sel = call.target.expand(2).select(call.forward.expanded(2)(both))
    return sel[: call.n], sel[call.n :]


def output_change(fx: Tensor, fb: Tensor) -> Tensor:
    """f(x) - f(b); a boolean output counts as 0/1 (bool tensors do not subtract)."""
    if fx.dtype == torch.bool:
        fx, fb = fx.long(), fb.long()
    return fx - fb


def completeness_delta(attrs: Tensors, fx: Tensor, fb: Tensor) -> Tensor:
    """sum of attributions minus (f(x) - f(b)), per example."""
    n = fx.shape[0]
    total = sum(a.reshape(n, -1).sum(1) for a in attrs)
    change = output_change(fx, fb)
    return total - change.to(total.dtype if isinstance(total, Tensor) else change.dtype)
