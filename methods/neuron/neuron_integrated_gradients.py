"""Neuron Integrated Gradients: integrated gradients of one neuron of a layer.

Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365, with the neuron in place of the
model output (Captum's ``NeuronIntegratedGradients``); the forward stops at the layer.
"""

from __future__ import annotations

from methods.engine.call import Call, Output
from methods.neuron._common import NeuronPathParams, neuron_grad_fn, neuron_path, neuron_target
from methods.registry import register


class NeuronIntegratedGradientsParams(NeuronPathParams):
    pass


@register(
    "neuron_integrated_gradients",
    family="neuron",
    params=NeuronIntegratedGradientsParams,
    needs_hooks=True,
    batching="internal_batch_size",
    needs_target=False,
    token_counterpart=None,
)
def neuron_integrated_gradients(call: Call, p: NeuronIntegratedGradientsParams) -> Output:
    """Integrated gradients of the selected neuron from the baselines to the inputs."""
    module, selector = neuron_target(call, p)
    return neuron_path(call, p, neuron_grad_fn(module, p, selector))
