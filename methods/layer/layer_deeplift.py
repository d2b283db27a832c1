"""Layer DeepLift: DeepLift (Rescale rule) multipliers at a layer, times the layer's change.

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685. Inputs and baselines run as one
doubled batch with every non-linear call intercepted (``methods.engine.intercept``); the
layer is cut out of the graph so the backward pass stops there, and the attribution is
(L(inputs) - L(baselines)) x multiplier. Works on token-id inputs (no input gradient needed).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from methods.call import Call, Output
from methods.engine import intercept, layers
from methods.engine.baselines import format_baselines
from methods.engine.batching import run_chunks
from methods.engine.inputs import Tensors
from methods.engine.targets import Target
from methods.gradient.deeplift import DeepLiftParams, apply_multipliers
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerDeepLiftParams(LayerParams, DeepLiftParams):
    pass


def layer_multipliers(
    call: Call, xs: Tensors, bs: Tensors, target: Target, module: nn.Module, p: LayerDeepLiftParams
) -> tuple[Tensors, Tensors, Tensors, Tensor, Tensor]:
    """Multipliers at the layer for the input half, the layer values of both halves, f(x), f(b)."""
    n = xs[0].shape[0]
    doubled = tuple(torch.cat([x, b]) for x, b in zip(xs, bs, strict=True))
    forward = intercept.ruled(call.forward.expanded(2), intercept.deeplift_rules(p.eps))
    grads, values, selected = layers.layer_gradients(
        forward, doubled, target.expand(2), module, p.layer, p.attribute_to_layer_input
    )
    return (
        tuple(g[:n] for g in grads),
        tuple(v[:n] for v in values),
        tuple(v[n:] for v in values),
        selected[:n],
        selected[n:],
    )


def _slice(call: Call, target: Target, s: int, e: int, total: int) -> tuple[Call, Target]:
    if s == 0 and e == total:
        return call, target
    args = tuple(
        a[s:e] if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == total else a
        for a in call.forward.args
    )
    rows = None if target.rows is None else target.rows[s:e]
    return (
        call.replace(forward=type(call.forward)(call.forward.fn, args)),
        Target(target.kind, target.index, rows),
    )


def run_layer_rows(
    call: Call, xs: Tensors, bs: Tensors, target: Target, module: nn.Module, p: LayerDeepLiftParams
) -> tuple[Tensors, Tensor, Tensor, dict[str, Any]]:
    """Layer DeepLift over paired rows (x_i, b_i), chunked by ``internal_batch_size``."""
    total = xs[0].shape[0]
    spec = call.internal_batch_size
    per = total if spec is None or spec == "auto" else max(1, int(spec) // 2)

    def chunk(s: int, e: int) -> tuple[Tensors, Tensor, Tensor]:
        sub, tgt = _slice(call, target, s, e, total)
        cx = tuple(x[s:e] for x in xs)
        cb = tuple(b[s:e] for b in bs)
        m, vx, vb, fx, fb = layer_multipliers(sub, cx, cb, tgt, module, p)
        return apply_multipliers(p, m, vx, vb), fx, fb

    parts, used = run_chunks(total, per, chunk, retry_oom=spec == "auto")
    attrs = tuple(torch.cat([pt[0][i] for pt in parts]) for i in range(len(parts[0][0])))
    fx = torch.cat([pt[1] for pt in parts])
    fb = torch.cat([pt[2] for pt in parts])
    return attrs, fx, fb, {"internal_batch_size": 2 * used}


def delta(attrs: Tensors, fx: Tensor, fb: Tensor) -> Tensor:
    rows = fx.shape[0]
    return sum(a.reshape(rows, -1).sum(1) for a in attrs) - (fx - fb)


@register(
    "layer_deeplift",
    kind="layer",
    params=LayerDeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    differentiates_inputs=False,
)
def layer_deeplift(call: Call, p: LayerDeepLiftParams) -> Output:
    """DeepLift attributions at the layer against the baselines (default zeros)."""
    module = target_layer(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    attrs, fx, fb, echo = run_layer_rows(call, xs, bs, call.target, module, p)
    return layer_output(attrs, delta=delta(attrs, fx, fb), outputs=fx, echo=echo)
