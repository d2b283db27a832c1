"""DeepLift with the Rescale rule (and DeepLift's max rule for max-pooling).

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685. Inputs and baselines run as one
doubled batch; every non-linear call (module or functional, reused or not) gets the rescale
multiplier of its own input and output differences (see ``methods.engine.intercept``), so a
model with ``F.relu`` gives the same numbers as its ``nn.ReLU`` twin, which Captum does not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field
from torch import Tensor

from methods.call import Call, Output
from methods.engine import intercept
from methods.engine.baselines import format_baselines
from methods.engine.batching import (
    measured_once,
    row_bytes_estimate,
    rows_per_chunk,
    run_chunks,
)
from methods.engine.gradients import grad_of_sum
from methods.engine.inputs import Tensors
from methods.engine.path import output_change
from methods.engine.targets import Target
from methods.params import MethodParams, PythonOnly
from methods.registry import TokenCounterpart, register


class DeepLiftParams(MethodParams):
    multiply_by_inputs: bool = Field(
        True, description="multiply the multipliers by (inputs - baselines)"
    )
    eps: float = Field(
        1e-10, gt=0, description="below this |input difference| the plain gradient is used"
    )
    custom_attribution_func: PythonOnly = Field(
        None, description="Python API only: f(multipliers[, inputs[, baselines]]) -> attributions"
    )


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
        with intercept.rules(intercept.deeplift_rules(eps)):
            out = forward(doubled)
        selected = target2.select(out) if grad_fn is None else grad_fn(out)
        grads = grad_of_sum(selected, leaves)
    mults = tuple(torch.zeros_like(x) if g is None else g for g, x in zip(grads, xs, strict=True))
    sel = selected.detach()
    return mults, sel[:n], sel[n:]


def apply_multipliers(p: DeepLiftParams, mults: Tensors, xs: Tensors, bs: Tensors) -> Tensors:
    if p.custom_attribution_func is not None:
        return _custom(p.custom_attribution_func, mults, xs, bs)
    if not p.multiply_by_inputs:
        return mults
    return tuple((x - b) * m for x, b, m in zip(xs, bs, mults, strict=True))


def _custom(fn: Callable[..., Any], mults: Tensors, xs: Tensors, bs: Tensors) -> Tensors:
    n = len(inspect.signature(fn).parameters)
    out = fn(mults) if n == 1 else fn(mults, xs) if n == 2 else fn(mults, xs, bs)
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def run_rows(
    call: Call, xs: Tensors, bs: Tensors, target: Target, p: DeepLiftParams
) -> tuple[Tensors, Tensor, Tensor, Tensor, dict[str, Any]]:
    """DeepLift over paired rows (x_i, b_i), chunked by ``internal_batch_size``."""
    total = xs[0].shape[0]
    spec = call.internal_batch_size
    if spec is None:
        per = total
    elif spec == "auto":
        probe = min(total, 4)

        def run_probe() -> object:
            sub = call.replace(forward=_slice_forward(call, 0, probe, total))
            cx, cb = tuple(x[:probe] for x in xs), tuple(b[:probe] for b in bs)
            return multipliers(sub, cx, cb, _slice_target(target, 0, probe), p.eps)

        measure = measured_once(
            call.model,
            call.shape_key("deeplift"),
            lambda: 2 * row_bytes_estimate(run_probe, probe),
        )
        per = rows_per_chunk("auto", total, measure)
    else:
        per = max(1, int(spec) // 2)  # each row is evaluated twice (input and baseline)

    def chunk(s: int, e: int) -> tuple[Tensors, Tensors, Tensor, Tensor]:
        sub = call.replace(forward=_slice_forward(call, s, e, total))
        cx = tuple(x[s:e] for x in xs)
        cb = tuple(b[s:e] for b in bs)
        m, fx, fb = multipliers(sub, cx, cb, _slice_target(target, s, e), p.eps)
        return apply_multipliers(p, m, cx, cb), m, fx, fb

    parts, used = run_chunks(total, per, chunk, retry_oom=call.internal_batch_size == "auto")
    attrs = tuple(torch.cat([pt[0][i] for pt in parts]) for i in range(len(xs)))
    fx = torch.cat([pt[2] for pt in parts])
    fb = torch.cat([pt[3] for pt in parts])
    n_in = len(xs)
    delta = sum(a.reshape(total, -1).sum(1) for a in attrs[:n_in]) - output_change(fx, fb)
    return attrs, fx, fb, delta, {"internal_batch_size": 2 * used}


def _slice_target(target: Target, s: int, e: int) -> Target:
    if target.rows is None:
        return target
    return Target(target.kind, target.index, target.rows[s:e])


def _slice_forward(call: Call, s: int, e: int, total: int) -> Any:
    if s == 0 and e == total:
        return call.forward
    args = tuple(
        a[s:e] if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == total else a
        for a in call.forward.args
    )
    return type(call.forward)(call.forward.fn, args)


@register(
    "deeplift",
    kind="gradient",
    params=DeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    token_counterpart=TokenCounterpart("layer_deeplift"),
)
def deeplift(call: Call, p: DeepLiftParams) -> Output:
    """DeepLift (Rescale rule) against the baselines (default zeros)."""
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    attrs, fx, _fb, delta, echo = run_rows(call, xs, bs, call.target, p)
    return Output(attrs, delta=delta, outputs=fx, echo=echo)
