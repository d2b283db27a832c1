"""Layer Integrated Gradients: integrated gradients in a layer's activation space.

Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365 (applied to a layer, as Captum's
``LayerIntegratedGradients``). The layer's values for the inputs and for the baselines come
from one forward that stops at the layer; along the path the layer's output (or input) is
replaced by the interpolated activation and the gradient taken with respect to it. For token
models the layer is the embedding: baselines are token ids (e.g. the pad id) and
``methods.tokens.per_token`` sums the result over the embedding dim.
"""

from __future__ import annotations

import torch

from methods.engine import layers
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.path import completeness_delta, path_gradient_sum
from methods.engine.quadrature import rule_tensors
from methods.errors import InvalidArgumentError
from methods.gradient.integrated_gradients import (
    AutoStepsParams,
    auto_cost,
    auto_integral,
    auto_rule,
    check_auto,
    ladder_top,
)
from methods.layer._common import LayerPathParams, layer_output, target_layer
from methods.params import MultiplyByInputsParams
from methods.registry import register


class LayerIntegratedGradientsParams(  # type: ignore[misc]  # n_steps may be "auto" here
    AutoStepsParams, LayerPathParams, MultiplyByInputsParams
):
    pass


def endpoint_values(
    call: Call, xs: Tensors, bs: Tensors, module: torch.nn.Module, path: str, to_input: bool
) -> tuple[Tensors, Tensors, tuple[torch.Tensor, torch.Tensor] | None]:
    """Layer values at the inputs and at the baselines from one doubled forward; with
    ``call.return_delta`` the forward runs to the end and also gives f(inputs), f(baselines)."""
    n = call.n
    both = tuple(torch.cat([x, b]) for x, b in zip(xs, bs, strict=True))
    fwd = call.forward.expanded(2)
    need_out = call.return_delta
    with torch.no_grad(), layers.tap(module, path, to_input=to_input, stop=not need_out) as t:
        out = layers.run(fwd, both, t)
    vals = tuple(v.detach() for v in t.values)
    ends = None
    if need_out and out is not None:
        sel = call.target.expand(2).select(out)
        ends = (sel[:n], sel[n:])
    return tuple(v[:n] for v in vals), tuple(v[n:] for v in vals), ends


@register(
    "layer_integrated_gradients",
    generation="layer_gradient",
    exportable=True,
    family="layer",
    params=LayerIntegratedGradientsParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    differentiates_inputs=False,
    cost=auto_cost,
    # "auto" stops once every example in the call has converged
    couples_examples=lambda p: p.n_steps == "auto",
    auto_steps=lambda p: ladder_top(auto_rule(p)),
)
def layer_integrated_gradients(call: Call, p: LayerIntegratedGradientsParams) -> Output:
    """Integrated gradients with respect to a layer's activations (e.g. token embeddings)."""
    module = target_layer(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    to_input = p.attribute_to_layer_input
    auto = p.n_steps == "auto"
    if auto:  # the delta decides when to stop: the endpoints' outputs are needed
        check_auto(p)
        call = call.replace(return_delta=True)
    ax, ab, ends = endpoint_values(call, xs, bs, module, p.path, to_input)
    n = call.n

    def grad_fn(sub: Call, points: Tensors) -> Tensors:
        k = points[0].shape[0] // n
        leaves = tuple(pt.detach().requires_grad_(True) for pt in points)
        grads, _, _ = layers.layer_gradients(
            sub.forward, layers.tile(xs, k), sub.target, module, p.path, to_input, leaves
        )
        return grads

    if auto and ends is not None:
        attrs, delta, echo = auto_integral(call, p, ax, ab, *ends, grad_fn=grad_fn)
        out = layer_output(attrs, echo=echo)
        out.delta, out.outputs = delta, ends[0]
        return out
    if auto:  # the layer's forward gave no output to stop on
        raise InvalidArgumentError(
            f"n_steps='auto' needs the model's output, but the forward stopped at {p.path!r}",
            argument="n_steps",
        )
    alphas, weights = rule_tensors(p.approximation_method, p.n_steps, ax[0].dtype, ax[0].device)
    grads, echo = path_gradient_sum(call, ax, ab, alphas, weights, grad_fn=grad_fn)
    if p.multiply_by_inputs:
        attrs = tuple((x - b) * g for x, b, g in zip(ax, ab, grads, strict=True))
    else:
        attrs = grads
    out = layer_output(attrs, echo=echo)
    if ends is not None:
        out.delta, out.outputs = completeness_delta(attrs, *ends), ends[0]
    return out
