"""Weighted sums of gradients along the straight path from baselines to inputs.

The core of integrated gradients and its relatives: for points alpha_k with weights w_k it
returns sum_k w_k * grad f(b + alpha_k (x - b)), evaluating all N x K path points in as few
batched forward+backward passes as the batch-size policy allows, step-major as Captum does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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

GradFn = Callable[[Call, Tensors], Tensors]


def plain_gradients(call: Call, points: Tensors) -> Tensors:
    return gradients(call.forward, points, call.target)[0]


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
                lambda: row_bytes_estimate(lambda: grad_fn(call, probe_points), n, extra),
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
) -> tuple[Tensors, dict[str, Any]]:
    """sum_k weights[k] * grad at b + alphas[k] * (x - b), per input; plus what was chosen.

    ``weights`` None: the gradient at every point instead, each input's with a leading dim K
    (n_steps="auto" keeps them to weigh them again at the next rung)."""
    n_steps = int(alphas.shape[0])
    n = call.n
    diffs = tuple(x - b for x, b in zip(xs, bs, strict=True))
    if per_chunk is None:
        per_chunk = steps_per_chunk(call, n_steps, xs, grad_fn)
    expanded: dict[int, Call] = {}

    def chunk(s: int, e: int) -> Tensors:
        k = e - s
        sub = expanded.get(k)
        if sub is None:
            sub = call.replace(forward=call.forward.expanded(k), target=call.target.expand(k))
            expanded[k] = sub
        a = alphas[s:e]
        points = tuple(
            (b.unsqueeze(0) + a.view(k, *([1] * d.dim())).to(d.dtype) * d.unsqueeze(0)).reshape(
                k * n, *d.shape[1:]
            )
            for b, d in zip(bs, diffs, strict=True)
        )
        grads = grad_fn(sub, points)
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
