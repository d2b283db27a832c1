"""Neuron Deconvolution: the deconvolution gradient of one neuron w.r.t. the inputs.

Zeiler & Fergus 2014, https://arxiv.org/abs/1311.2901. Every ReLU call (module or
functional, reused or not) passes on relu(gradient w.r.t. the ReLU output).
"""

from __future__ import annotations

from methods.engine import intercept
from methods.engine.call import Call, Output
from methods.neuron._common import NeuronParams, ruled_neuron_gradients
from methods.registry import register


@register(
    "neuron_deconvolution",
    family="neuron",
    params=NeuronParams,
    needs_hooks=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_deconvolution(call: Call, p: NeuronParams) -> Output:
    """Deconvolution gradient of the selected neuron with respect to each input."""
    return ruled_neuron_gradients(call, p, intercept.DECONVOLUTION)
