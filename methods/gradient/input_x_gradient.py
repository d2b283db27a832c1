"""Input x Gradient: each input element times the target's gradient with respect to it.

Shrikumar et al. 2016, https://arxiv.org/abs/1605.01713
"""

from __future__ import annotations

from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.params import NoParams
from methods.registry import TokenCounterpart, register


@register(
    "input_x_gradient",
    generation="gradient",
    exportable=True,
    family="gradient",
    params=NoParams,
    token_counterpart=TokenCounterpart("layer_gradient_x_activation"),
)
def input_x_gradient(call: Call, p: NoParams) -> Output:
    """Input times the gradient of the targeted output with respect to it."""
    grads, selected = gradients(call.forward, call.inputs, call.target)
    return Output(tuple(x * g for x, g in zip(call.inputs, grads, strict=True)), outputs=selected)
