"""Layer Gradient x Activation: the layer's activation times the target's gradient there.

Shrikumar et al. 2016, https://arxiv.org/abs/1605.01713 (input x gradient, at a layer).
"""

from __future__ import annotations

from pydantic import Field

from methods.engine import layers
from methods.engine.call import Call, Output
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerGradientXActivationParams(LayerParams):
    multiply_by_inputs: bool = Field(
        True, description="multiply the layer gradient by the activation (else the gradient)"
    )


@register(
    "layer_gradient_x_activation",
    generation="layer_gradient",
    family="layer",
    params=LayerGradientXActivationParams,
    needs_hooks=True,
    differentiates_inputs=False,
)
def layer_gradient_x_activation(call: Call, p: LayerGradientXActivationParams) -> Output:
    """Gradient of the targeted output with respect to the layer, times the activation."""
    module = target_layer(call, p)
    grads, values, selected = layers.layer_gradients(
        call.forward, call.inputs, call.target, module, p.path, p.attribute_to_layer_input
    )
    if p.multiply_by_inputs:
        grads = tuple(g * v for g, v in zip(grads, values, strict=True))
    return layer_output(grads, outputs=selected)
