"""Layer DeepLift: DeepLift (Rescale rule) multipliers at a layer, times the layer's change.

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685. Inputs and baselines run as one
doubled batch with every non-linear call intercepted (``methods.engine.deeplift``); the
layer is cut out of the graph so the backward pass stops there, and the attribution is
(L(inputs) - L(baselines)) x multiplier. Works on token-id inputs (no input gradient needed).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from methods.engine import deeplift as dl
from methods.engine import intercept, layers
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.path import completeness_delta
from methods.engine.targets import Target
from methods.gradient.deeplift import DeepLiftParams
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerDeepLiftParams(LayerParams, DeepLiftParams):
    pass


def layer_step(module: nn.Module, p: LayerDeepLiftParams) -> dl.Step:
    """Multipliers at the layer for the input half, the layer values of both halves, f(x), f(b)."""

    def step(
        call: Call, xs: Tensors, bs: Tensors, target: Target
    ) -> tuple[Tensors, Tensors, Tensors, Tensor, Tensor]:
        n = xs[0].shape[0]
        doubled = tuple(torch.cat([x, b]) for x, b in zip(xs, bs, strict=True))
        forward = intercept.ruled(call.forward.expanded(2), dl.composite(p.eps))
        grads, values, selected = layers.layer_gradients(
            forward, doubled, target.expand(2), module, p.path, p.attribute_to_layer_input
        )
        return (
            tuple(g[:n] for g in grads),
            tuple(v[:n] for v in values),
            tuple(v[n:] for v in values),
            selected[:n],
            selected[n:],
        )

    return step


@register(
    "layer_deeplift",
    family="layer",
    params=LayerDeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    differentiates_inputs=False,
)
def layer_deeplift(call: Call, p: LayerDeepLiftParams) -> Output:
    """DeepLift attributions at the layer against the baselines (default zeros)."""
    step = layer_step(target_layer(call, p), p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    attrs, fx, fb, echo = dl.run_rows(call, xs, bs, call.target, step, p.combiner())
    return layer_output(attrs, delta=completeness_delta(attrs, fx, fb), outputs=fx, echo=echo)
