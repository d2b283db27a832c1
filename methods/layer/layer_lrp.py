"""Layer LRP: the relevance arriving at a layer's output (or leaving through its input).

Bach et al. 2015, https://doi.org/10.1371/journal.pone.0130140, read at ``layer`` with the
same rules as ``lrp``. Unlike Captum, any module can be the layer (activations too), and
reused or functional layers are propagated correctly.
"""

from __future__ import annotations

from methods.engine import layers
from methods.engine.call import Call, Output
from methods.gradient.lrp import (
    LRPParams,
    conservation_delta,
    parse_rules,
    relevance_forward,
    scale,
)
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerLRPParams(LayerParams, LRPParams):
    pass


@register(
    "layer_lrp",
    family="layer",
    params=LayerLRPParams,
    needs_hooks=True,
    returns_delta=True,
    differentiates_inputs=False,
)
def layer_lrp(call: Call, p: LayerLRPParams) -> Output:
    """Relevance of each unit of the layer for the targeted output."""
    module = target_layer(call, p)
    forward = relevance_forward(call, parse_rules(call.model, p.rules))
    grads, _, selected = layers.layer_gradients(
        forward, call.inputs, call.target, module, p.path, p.attribute_to_layer_input
    )
    relevance = scale(grads, selected)
    return layer_output(relevance, delta=conservation_delta(relevance, selected), outputs=selected)
