"""Neuron Integrated Gradients: integrated gradients of one neuron of a layer.

Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365, with the neuron in place of the
model output (Captum's ``NeuronIntegratedGradients``); the forward stops at the layer.
"""

from __future__ import annotations

from pydantic import Field

from methods.call import Call, Output
from methods.engine.baselines import format_baselines
from methods.engine.path import path_gradient_sum
from methods.engine.quadrature import ApproximationMethod, rule_tensors
from methods.neuron._common import NeuronParams, neuron_grad_fn, neuron_target
from methods.registry import register


class NeuronIntegratedGradientsParams(NeuronParams):
    n_steps: int = Field(50, ge=1, description="integration points along the path")
    approximation_method: ApproximationMethod = Field(
        "gausslegendre", description="quadrature rule along the path"
    )
    multiply_by_inputs: bool = Field(
        True, description="multiply the integrated gradient by (inputs - baselines)"
    )


@register(
    "neuron_integrated_gradients",
    kind="neuron",
    params=NeuronIntegratedGradientsParams,
    needs_hooks=True,
    batching="internal_batch_size",
    needs_target=False,
    token_counterpart=None,
)
def neuron_integrated_gradients(call: Call, p: NeuronIntegratedGradientsParams) -> Output:
    """Integrated gradients of the selected neuron from the baselines to the inputs."""
    module, selector = neuron_target(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    alphas, weights = rule_tensors(p.approximation_method, p.n_steps, xs[0].dtype, xs[0].device)
    grads, echo = path_gradient_sum(
        call, xs, bs, alphas, weights, grad_fn=neuron_grad_fn(module, p, selector)
    )
    if p.multiply_by_inputs:
        grads = tuple((x - b) * g for x, b, g in zip(xs, bs, grads, strict=True))
    return Output(grads, echo=echo)
