"""GradientShap: expected gradients over random baselines and random points on the path.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874; Erion et al. 2019 (expected gradients).
Per example, ``n_samples`` rows each draw a baseline row, Gaussian input noise (``stdevs``) and
alpha ~ U(0, 1); attribution = mean over rows of (x_noisy - b) * grad f(b + alpha (x_noisy - b)).
Captum's sampling draws from numpy's global RNG; ours from torch (seedable), so values agree in
distribution. Unlike Captum, the N * n_samples rows are chunked by ``internal_batch_size``.
"""

from __future__ import annotations

import dataclasses

import torch
from pydantic import Field

from methods.engine.baselines import format_baseline_distribution
from methods.engine.batching import (
    measured_once,
    row_bytes_estimate,
    rows_per_chunk,
    run_chunks,
)
from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.engine.inputs import Tensors
from methods.engine.path import output_change
from methods.errors import InvalidArgumentError
from methods.params import NoisySamplesParams, NonNegativeFloat
from methods.registry import TokenCounterpart, register


class GradientShapParams(NoisySamplesParams):
    stdevs: NonNegativeFloat | tuple[NonNegativeFloat, ...] = Field(
        0.0, description="standard deviation of the input noise, one or one per input"
    )


@register(
    "gradient_shap",
    exportable=True,
    family="gradient",
    params=GradientShapParams,
    returns_delta=True,
    stochastic=True,
    batching="internal_batch_size",
    baseline_distribution=True,
    token_counterpart=TokenCounterpart("layer_gradient_shap"),
)
def gradient_shap(call: Call, p: GradientShapParams) -> Output:
    """SHAP values approximated by gradients at random points between baselines and inputs."""
    xs = call.inputs
    dist = format_baseline_distribution(call.baselines, xs, "gradient_shap")
    stdevs = p.stdevs if isinstance(p.stdevs, tuple) else (p.stdevs,) * len(xs)
    if len(stdevs) != len(xs) or any(s < 0 for s in stdevs):
        raise InvalidArgumentError(
            f"stdevs must be one non-negative number or one per input ({len(xs)})",
            argument="stdevs",
        )
    n, k = call.n, p.n_samples
    rows = n * k
    idx = call.randint(dist[0].shape[0], (rows,), xs[0].device)
    noisy = tuple(
        x.repeat_interleave(k, dim=0) + (call.randn((rows, *x.shape[1:]), x) * s if s > 0 else 0)
        for x, s in zip(xs, stdevs, strict=True)
    )
    bs = tuple(d[idx] for d in dist)
    alphas = call.rand((rows,), xs[0])
    sub = call.replace(
        forward=call.forward.expanded(k, interleave=True),
        target=call.target.expand(k, interleave=True),
    )
    points = tuple(
        b + alphas.view(-1, *([1] * (x.dim() - 1))) * (x - b)
        for x, b in zip(noisy, bs, strict=True)
    )

    def chunk(s: int, e: int) -> Tensors:
        fwd = sub.forward
        if e - s != rows:
            fwd = dataclasses.replace(
                fwd,
                args=tuple(
                    a[s:e]
                    if isinstance(a, torch.Tensor) and a.dim() >= 1 and a.shape[0] == rows
                    else a
                    for a in fwd.args
                ),
            )
        tgt = sub.target.take(slice(s, e))
        return gradients(fwd, tuple(pt[s:e] for pt in points), tgt)[0]

    per = rows_per_chunk(
        call.internal_batch_size,
        rows,
        measured_once(
            call.model,
            call.shape_key("rows"),
            lambda: row_bytes_estimate(lambda: chunk(0, min(rows, n)), min(rows, n)),
        ),
        granule=1,
        device=xs[0].device,
    )
    parts, used = run_chunks(rows, per, chunk, retry_oom=call.internal_batch_size == "auto")
    grads = tuple(torch.cat([pt[i] for pt in parts]) for i in range(len(xs)))
    if p.multiply_by_inputs:
        per_row = tuple(g * (x - b) for g, x, b in zip(grads, noisy, bs, strict=True))
    else:
        per_row = grads
    attrs = tuple(a.reshape(n, k, *a.shape[1:]).mean(1) for a in per_row)
    out = Output(attrs, echo={"internal_batch_size": used})
    if call.return_delta:
        with torch.no_grad():
            both = tuple(torch.cat([x, b]) for x, b in zip(noisy, bs, strict=True))
            sel = sub.target.expand(2).select(sub.forward.expanded(2)(both))
        total = sum(a.reshape(rows, -1).sum(1) for a in per_row)
        out.delta = total - output_change(sel[:rows], sel[rows:])
    return out
