"""Neuron Gradient: the gradient of one neuron of a layer with respect to the inputs."""

from __future__ import annotations

from methods.engine import neurons
from methods.engine.call import Call, Output
from methods.neuron._common import NeuronParams, neuron_target
from methods.registry import register


@register(
    "neuron_gradient",
    family="neuron",
    params=NeuronParams,
    needs_hooks=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_gradient(call: Call, p: NeuronParams) -> Output:
    """Gradient of the selected neuron with respect to each input (the forward stops there)."""
    module, selector = neuron_target(call, p)
    grads, _ = neurons.neuron_gradients(
        call.forward, call.inputs, module, p.layer, p.attribute_to_neuron_input, selector
    )
    return Output(grads)
