"""Saliency: the gradient of the target with respect to the inputs.

Simonyan et al. 2013, https://arxiv.org/abs/1312.6034
"""

from __future__ import annotations

from pydantic import Field

from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.params import MethodParams
from methods.registry import TokenCounterpart, register


class SaliencyParams(MethodParams):
    abs: bool = Field(True, description="return the absolute value of the gradient")


@register(
    "saliency",
    generation="gradient",
    exportable=True,
    family="gradient",
    params=SaliencyParams,
    token_counterpart=TokenCounterpart(
        "layer_gradient_x_activation",
        post_abs=True,
        set_params={"multiply_by_inputs": False},
        drop_params=frozenset({"abs"}),
    ),
)
def saliency(call: Call, p: SaliencyParams) -> Output:
    """Gradient of the targeted output with respect to each input element (absolute by default)."""
    grads, selected = gradients(call.forward, call.inputs, call.target)
    if p.abs:
        grads = tuple(g.abs() for g in grads)
    return Output(grads, outputs=selected)
