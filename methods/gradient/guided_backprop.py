"""Guided Backpropagation: gradients with negative signals stopped at every ReLU.

Springenberg et al. 2015, https://arxiv.org/abs/1412.6806. Applied to every ReLU *call*, so
functional ``F.relu`` and reused modules are treated like ``nn.ReLU`` modules.
"""

from __future__ import annotations

from methods.engine import intercept
from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.params import NoParams
from methods.registry import register


@register(
    "guided_backprop",
    exportable=True,
    family="gradient",
    params=NoParams,
    needs_hooks=True,
    token_counterpart=None,
)
def guided_backprop(call: Call, p: NoParams) -> Output:
    """Gradient with ReLU backward replaced by relu(gradient w.r.t. the ReLU input)."""
    forward = intercept.ruled(call.forward, intercept.GUIDED_BACKPROP)
    grads, selected = gradients(forward, call.inputs, call.target)
    return Output(grads, outputs=selected)
