"""Neuron GradientShap: expected gradients of one neuron over random baselines and points.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874, with the neuron in place of the model
output. Sampling uses torch's generator (seedable); values agree with Captum in distribution.
"""

from __future__ import annotations

from methods.engine import neurons
from methods.engine.call import Call, Output
from methods.layer._common import GradientShapParams, shap_samples
from methods.neuron._common import NeuronParams, neuron_target
from methods.registry import register


class NeuronGradientShapParams(NeuronParams, GradientShapParams):
    pass


@register(
    "neuron_gradient_shap",
    family="neuron",
    params=NeuronGradientShapParams,
    needs_hooks=True,
    stochastic=True,
    baseline_distribution=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_gradient_shap(call: Call, p: NeuronGradientShapParams) -> Output:
    """SHAP values for the selected neuron, approximated by gradients at random path points."""
    module, selector = neuron_target(call, p)
    sub, noisy, bs, points = shap_samples(call, p.n_samples, p.stdevs, "neuron_gradient_shap")
    grads, _ = neurons.neuron_gradients(
        sub.forward, points, module, p.layer, p.attribute_to_neuron_input, selector
    )
    if p.multiply_by_inputs:
        grads = tuple((x - b) * g for x, b, g in zip(noisy, bs, grads, strict=True))
    n, k = call.n, p.n_samples
    return Output(tuple(g.reshape(n, k, *g.shape[1:]).mean(1) for g in grads))
