"""Neuron Guided Backpropagation: guided backprop of one neuron w.r.t. the inputs.

Springenberg et al. 2015, https://arxiv.org/abs/1412.6806. Every ReLU call (module or
functional, reused or not) passes on relu(gradient w.r.t. the ReLU input).
"""

from __future__ import annotations

from methods.engine import intercept
from methods.engine.call import Call, Output
from methods.neuron._common import NeuronParams, ruled_neuron_gradients
from methods.registry import register


@register(
    "neuron_guided_backprop",
    family="neuron",
    params=NeuronParams,
    needs_hooks=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_guided_backprop(call: Call, p: NeuronParams) -> Output:
    """Guided Backpropagation gradient of the selected neuron with respect to each input."""
    return ruled_neuron_gradients(call, p, intercept.GUIDED_BACKPROP)
