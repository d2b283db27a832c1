"""Deconvolution: gradients where each ReLU passes on relu(its output gradient).

Zeiler & Fergus 2014, https://arxiv.org/abs/1311.2901. Applied to every ReLU call.
"""

from __future__ import annotations

from methods.engine import intercept
from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.params import NoParams
from methods.registry import register


@register(
    "deconvolution",
    exportable=True,
    family="gradient",
    params=NoParams,
    needs_hooks=True,
    token_counterpart=None,
)
def deconvolution(call: Call, p: NoParams) -> Output:
    """Gradient with ReLU backward replaced by relu(gradient w.r.t. the ReLU output)."""
    forward = intercept.ruled(call.forward, intercept.DECONVOLUTION)
    grads, selected = gradients(forward, call.inputs, call.target)
    return Output(grads, outputs=selected)
