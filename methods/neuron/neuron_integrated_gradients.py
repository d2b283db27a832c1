"""Neuron Integrated Gradients: integrated gradients of one neuron of a layer.

Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365, with the neuron in place of the
model output (Captum's ``NeuronIntegratedGradients``); the forward stops at the layer.
``n_steps="auto"`` integrates on the same nested ladder as integrated gradients, stopping on
completeness against the neuron: the attributions sum to neuron(x) - neuron(baseline).
"""

from __future__ import annotations

from methods.engine import neurons
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.errors import InvalidArgumentError
from methods.gradient.integrated_gradients import (
    AutoStepsParams,
    auto_cost,
    auto_integral,
    auto_rule,
    check_auto,
    ladder_top,
)
from methods.neuron._common import NeuronPathParams, neuron_grad_fn, neuron_path, neuron_target
from methods.registry import register


class NeuronIntegratedGradientsParams(  # type: ignore[misc]  # n_steps may be "auto" here
    AutoStepsParams, NeuronPathParams
):
    pass


@register(
    "neuron_integrated_gradients",
    family="neuron",
    params=NeuronIntegratedGradientsParams,
    needs_hooks=True,
    batching="internal_batch_size",
    needs_target=False,
    token_counterpart=None,
    cost=auto_cost,
    # "auto" stops once every example in the call has converged
    couples_examples=lambda p: p.n_steps == "auto",
    auto_steps=lambda p: ladder_top(auto_rule(p)),
)
def neuron_integrated_gradients(call: Call, p: NeuronIntegratedGradientsParams) -> Output:
    """Integrated gradients of the selected neuron from the baselines to the inputs."""
    module, selector = neuron_target(call, p)
    grad_fn = neuron_grad_fn(module, p, selector)
    if p.n_steps != "auto":
        return neuron_path(call, p, grad_fn)
    check_auto(p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    fx, fb = (
        neurons.neuron_gradients(
            call.forward, t, module, p.layer, p.attribute_to_neuron_input, selector
        )[1]
        for t in (xs, bs)
    )
    if tuple(fx.shape) != (call.n,):
        raise InvalidArgumentError(
            "n_steps='auto' stops when each example's attributions sum to its neuron's change; "
            f"this neuron_selector gives values of shape {list(fx.shape)}, not one per example: "
            "give n_steps a number",
            argument="n_steps",
        )
    attrs, _, echo = auto_integral(call, p, xs, bs, fx, fb, grad_fn=grad_fn)
    return Output(attrs, echo=echo)
