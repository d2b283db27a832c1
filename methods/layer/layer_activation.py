"""Layer Activation: the layer's output (or input) itself, from a forward that stops there."""

from __future__ import annotations

from methods.engine import layers
from methods.engine.call import Call, Output
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


@register(
    "layer_activation",
    family="layer",
    params=LayerParams,
    needs_hooks=True,
    differentiates_inputs=False,
    needs_target=False,
    forward_only=True,
)
def layer_activation(call: Call, p: LayerParams) -> Output:
    """The layer's activations for the inputs (computed without gradients)."""
    module = target_layer(call, p)
    values = layers.activations(
        call.forward, call.inputs, module, p.path, p.attribute_to_layer_input
    )
    return layer_output(values)
