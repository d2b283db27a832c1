"""DeepLift's rules and multipliers: what DeepLift, DeepLiftShap and their layer and neuron
variants share.

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685. Inputs and baselines run as one
doubled batch (inputs first); every op of the table with a DeepLift rule (``ops``: rescale
for element-wise non-linearities, softmax, max for max-pooling) gets its rule applied to its
own input and output differences, through ``intercept``.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from methods.engine import intercept
from methods.engine.baselines import format_baseline_distribution
from methods.engine.batching import measured_once, row_bytes_estimate, rows_per_chunk, run_chunks
from methods.engine.call import Call
from methods.engine.gradients import grad_of_sum
from methods.engine.inputs import Tensors
from methods.engine.intercept import Composite, Site
from methods.engine.targets import Target

# --- the rules


def _halves_ok(x: Tensor) -> bool:
    return x.dim() >= 1 and x.shape[0] % 2 == 0


def _halves(t: Tensor) -> tuple[Tensor, Tensor]:
    """The input and baseline halves of a doubled batch (slices keep a symbolic batch size
    symbolic when traced by ``methods.export``; ``chunk(2)`` leaves a guard it cannot prove)."""
    n = t.shape[0] // 2
    return t[:n], t[n:]


def _diffs(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    xi, xr = _halves(x)
    yi, yr = _halves(y)
    dx, dy = xi - xr, yi - yr
    return torch.cat([dx, dx]), torch.cat([dy, dy])


def rescale_rule(eps: float) -> intercept.Rule:
    """g * dy/dx per element, the plain gradient where |dx| < eps."""

    def rule(site: Site, g: Tensor) -> Tensor:
        plain = site.vjp(g)
        if not _halves_ok(site.x):
            return plain
        dx, dy = _diffs(site.x, site.y)
        return torch.where(dx.abs() < eps, plain, g * dy / dx)

    return rule


def softmax_rule(eps: float) -> intercept.Rule:
    """DeepLift's Rescale rule through softmax written as ``exp(x - logsumexp(x))``.

    Per example (reductions along the softmax dim only), with z = x - a, a = logsumexp(x):
    a's multipliers are w_k = sec(x_k, x'_k) / sec(a, a') (rescale through exp, then through
    log) and y = exp(z)'s are r_j = sec(z_j, z'_j), where sec(u, v) = (e^u - e^v) / (u - v);
    the multipliers m_k = g_k r_k - (g . r) w_k give sum(m * dx) = sum(g * dy) exactly and
    reduce to the gradient as x' -> x and for a shift x = x' + c. Every secant is taken as
    e^max(u, v) * (1 - e^-|u - v|) / |u - v| and every exponent is relative to the larger
    logsumexp, so nothing cancels or underflows that matters, whatever the logits' gap (a
    baseline's exp(x' - max x) underflowed at gaps of ~100 in float32 and ~800 in float64).
    Captum 0.9.0 instead centres rescale multipliers over the whole doubled batch, which
    breaks completeness and couples the examples (see README).
    """

    def rule(site: Site, g: Tensor) -> Tensor:
        x, y = site.x, site.y
        dim = _softmax_dim(x, site)
        if not _halves_ok(x) or dim is None:
            return site.vjp(g)  # a softmax over the batch mixes inputs and baselines itself
        xi, xr = _halves(x.to(y.dtype))
        zi, zr = xi.log_softmax(dim), xr.log_softmax(dim)  # precise: x - max(x) is exact
        da = xi.logsumexp(dim, keepdim=True) - xr.logsumexp(dim, keepdim=True)
        # x - max(a, a') as z - (max(a, a') - a): no rounding of a logsumexp near |x|
        top = torch.maximum(zi - (-da).clamp(min=0), zr - da.clamp(min=0))
        w = top.exp() * _flat(xi - xr, eps) / _flat(da, eps)
        r = torch.maximum(zi, zr).exp() * _flat(zi - zr, eps)
        r2, w2 = torch.cat([r, r]), torch.cat([w, w])
        gr = g * r2
        return (gr - gr.sum(dim, keepdim=True) * w2).to(x.dtype)

    return rule


def _flat(d: Tensor, eps: float) -> Tensor:
    """(1 - e^-|d|) / |d|: exp's secant over a gap d relative to e^max (1 where |d| < eps or
    both ends are -inf, as with masked logits; 0 where one end is -inf)."""
    flat = (d.abs() < eps) | d.isnan()
    ad = torch.where(flat, torch.ones_like(d), d.abs())
    return torch.where(flat, torch.ones_like(d), -torch.expm1(-ad) / ad)


def _softmax_dim(x: Tensor, site: Site) -> int | None:
    """The softmax's dim, normalised; None where it is the batch dim (or cannot be found)."""
    dim = site.kwargs.get("dim", site.args[0] if site.args else None)
    if dim is None:  # torch's legacy implicit choice (F._get_softmax_dim)
        dim = 0 if x.dim() in (0, 1, 3) else 1
    if not isinstance(dim, int) or x.dim() == 0:
        return None
    dim %= x.dim()
    return None if dim == 0 else dim


def max_rule(eps: float) -> intercept.Rule:
    """DeepLift's max rule: each window's output change goes to its argmax in both halves.

    Where windows overlap (stride < kernel size, e.g. MaxPool2d(3, 2, 1)) one input can be the
    argmax of several windows; their changes are *added* (Captum's ``max_unpool`` keeps one,
    which breaks completeness). With non-overlapping windows this equals Captum exactly.
    """

    def rule(site: Site, g: Tensor) -> Tensor:
        x, y = site.x, site.y
        plain = site.vjp(g)
        if not _halves_ok(x):
            return plain
        xi, xr = _halves(x)
        yi, yr = _halves(y)
        dx = torch.cat([xi - xr, xi - xr])
        ymax = torch.max(yi, yr)
        dy = torch.cat([ymax - yr, yi - ymax])
        _, indices = site.func(x, *_pool_params(site.args, site.kwargs), return_indices=True)
        a, b = _halves(_scatter_unpool(g * dy, indices, x.shape, site.op.dims))
        summed = a + b
        return torch.where(dx.abs() < eps, plain, torch.cat([summed, summed]) / dx)

    return rule


def _scatter_unpool(src: Tensor, indices: Tensor, shape: torch.Size, dims: int) -> Tensor:
    """``max_unpool`` that adds: ``src`` summed at the flat spatial ``indices``."""
    lead = tuple(shape[: len(shape) - dims])
    out = src.new_zeros(*lead, math.prod(shape[len(lead) :]))
    out.scatter_add_(len(lead), indices.reshape(*lead, -1), src.reshape(*lead, -1))
    return out.reshape(shape)


def _pool_params(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """kernel_size, stride, padding, dilation, ceil_mode of a max-pool call."""
    names = ["kernel_size", "stride", "padding", "dilation", "ceil_mode"]
    defaults: list[Any] = [None, None, 0, 1, False]
    values = list(rest[:5]) + defaults[len(rest[:5]) :]
    for i, name in enumerate(names):
        if name in kwargs:
            values[i] = kwargs[name]
    return values


def composite(eps: float) -> Composite:
    """DeepLift's rules by the ops table's ``deeplift`` column."""
    return Composite(
        "deeplift",
        {"rescale": rescale_rule(eps), "softmax": softmax_rule(eps), "max": max_rule(eps)},
    )


# --- multipliers and attributions

#: combine(multipliers, inputs, baselines) -> attributions
Combine = Callable[[Tensors, Tensors, Tensors], Tensors]


def multipliers(
    call: Call, xs: Tensors, bs: Tensors, target: Target, eps: float, grad_fn: Any = None
) -> tuple[Tensors, Tensor, Tensor]:
    """DeepLift multipliers of the targeted output w.r.t. ``xs`` against ``bs`` (same shapes).

    Returns the multipliers and the targeted outputs f(xs), f(bs). ``grad_fn``, if given,
    replaces the target selection: it receives the doubled output and returns the scalar to
    differentiate (neuron methods use this).
    """
    n = xs[0].shape[0]
    forward = call.forward.expanded(2)
    target2 = target.expand(2)
    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_(True) for x in xs)
        doubled = tuple(torch.cat([x, b]) for x, b in zip(leaves, bs, strict=True))
        with intercept.rules(composite(eps)):
            out = forward(doubled)
        selected = target2.select(out) if grad_fn is None else grad_fn(out)
        grads = grad_of_sum(selected, leaves)
    mults = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True))
    sel = selected.detach()
    if sel.dim() == 0:  # a neuron selector's whole-batch aggregate: no per-row outputs
        return mults, sel, sel
    return mults, sel[:n], sel[n:]


def combiner(multiply_by_inputs: bool, custom: Callable[..., Any] | None = None) -> Combine:
    """Attributions from multipliers: (x - b) * m, m alone, or the caller's function of
    (multipliers[, inputs[, baselines]])."""

    def combine(mults: Tensors, xs: Tensors, bs: Tensors) -> Tensors:
        if custom is not None:
            n = len(inspect.signature(custom).parameters)
            args = (mults, xs, bs)[: n if n in (1, 2) else 3]
            out = custom(*args)
            return tuple(out) if isinstance(out, (tuple, list)) else (out,)
        if not multiply_by_inputs:
            return mults
        return tuple((x - b) * m for x, b, m in zip(xs, bs, mults, strict=True))

    return combine


def slice_rows(call: Call, target: Target, s: int, e: int, total: int) -> tuple[Call, Target]:
    """The call and target for rows s..e-1 (per-example forward args and targets sliced)."""
    if s == 0 and e == total:
        return call, target
    args = tuple(
        a[s:e] if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == total else a
        for a in call.forward.args
    )
    return call.replace(forward=dataclasses.replace(call.forward, args=args)), target.take(
        slice(s, e)
    )


#: step(call, xs, bs, target) -> (multipliers, values at x, values at b, f(x), f(b)); the
#: values are what the multipliers multiply: the inputs, or a layer's values
Step = Callable[[Call, Tensors, Tensors, Target], tuple[Tensors, Tensors, Tensors, Tensor, Tensor]]


def input_step(eps: float) -> Step:
    """Multipliers with respect to the inputs themselves."""

    def step(
        call: Call, xs: Tensors, bs: Tensors, target: Target
    ) -> tuple[Tensors, Tensors, Tensors, Tensor, Tensor]:
        m, fx, fb = multipliers(call, xs, bs, target, eps)
        return m, xs, bs, fx, fb

    return step


def run_rows(
    call: Call, xs: Tensors, bs: Tensors, target: Target, step: Step, combine: Combine
) -> tuple[Tensors, Tensor, Tensor, dict[str, Any]]:
    """``step`` over paired rows (x_i, b_i), chunked by ``internal_batch_size`` (each row runs
    twice: input and baseline): the combined attributions, f(x), f(b) and the batching echo."""
    total = xs[0].shape[0]
    spec = call.internal_batch_size

    def chunk(s: int, e: int) -> tuple[Tensors, Tensor, Tensor]:
        sub, tgt = slice_rows(call, target, s, e, total)
        m, vx, vb, fx, fb = step(sub, tuple(x[s:e] for x in xs), tuple(b[s:e] for b in bs), tgt)
        return combine(m, vx, vb), fx, fb

    if spec is None:
        per = total
    elif spec == "auto":
        probe = min(total, 4)
        measure = measured_once(
            call.model,
            call.shape_key(call.method),
            lambda: row_bytes_estimate(lambda: chunk(0, probe), probe).scaled(2),
            call.shape_family(call.method),
        )
        per = rows_per_chunk("auto", total, measure, device=call.inputs[0].device)
    else:
        per = max(1, int(spec) // 2)
    parts, used = run_chunks(total, per, chunk, retry_oom=spec == "auto")
    attrs = tuple(torch.cat([pt[0][i] for pt in parts]) for i in range(len(parts[0][0])))
    fx = torch.cat([pt[1] for pt in parts])
    fb = torch.cat([pt[2] for pt in parts])
    return attrs, fx, fb, {"internal_batch_size": 2 * used}


# --- DeepLiftShap: every example paired with every baseline row


def baseline_pairs(call: Call) -> tuple[Call, Tensors, Tensors, int]:
    """Each example paired with each row of the baseline distribution, example-major as Captum
    pairs them: the call over the N * B pairs, their inputs and baselines, and B."""
    dist = format_baseline_distribution(call.baselines, call.inputs, call.method)
    n, b = call.n, dist[0].shape[0]
    xs = tuple(x.repeat_interleave(b, dim=0) for x in call.inputs)
    bs = tuple(d.repeat((n,) + (1,) * (d.dim() - 1)) for d in dist)
    sub = call.replace(
        forward=call.forward.expanded(b, interleave=True),
        target=call.target.expand(b, interleave=True),
    )
    return sub, xs, bs, b


def pair_mean(ts: Tensors, b: int) -> Tensors:
    """Per-example means over the ``b`` baseline rows of ``baseline_pairs``."""
    return tuple(t.reshape(-1, b, *t.shape[1:]).mean(1) for t in ts)
