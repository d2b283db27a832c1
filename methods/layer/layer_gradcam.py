"""Grad-CAM: a layer's channels weighted by their spatially averaged target gradients.

Selvaraju et al. 2017, https://arxiv.org/abs/1610.02391. Gradients (N, C, ...) are averaged
over the dims after the channel dim; with ``attr_dim_summation`` the weighted channels are
summed to (N, 1, ...); ``relu_attributions`` keeps the positive part. A 2-D layer (N, C) is
not averaged, as in Captum.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field

from methods.engine import layers
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerGradCamParams(LayerParams):
    relu_attributions: bool = Field(False, description="apply a ReLU to the result")
    attr_dim_summation: bool = Field(
        True, description="sum over the channel dim (else keep one map per channel)"
    )


def gradcam(grads: Tensors, values: Tensors, relu: bool, summation: bool) -> Tensors:
    out = []
    for g, v in zip(grads, values, strict=True):
        w = g.mean(dim=tuple(range(2, g.dim())), keepdim=True) if g.dim() > 2 else g
        a = (w * v).sum(dim=1, keepdim=True) if summation else w * v
        out.append(F.relu(a) if relu else a)
    return tuple(out)


@register(
    "layer_gradcam",
    exportable=True,
    family="layer",
    params=LayerGradCamParams,
    needs_hooks=True,
    differentiates_inputs=False,
)
def layer_gradcam(call: Call, p: LayerGradCamParams) -> Output:
    """Grad-CAM map at the layer for the targeted output."""
    module = target_layer(call, p)
    grads, values, selected = layers.layer_gradients(
        call.forward, call.inputs, call.target, module, p.path, p.attribute_to_layer_input
    )
    attrs = gradcam(grads, values, p.relu_attributions, p.attr_dim_summation)
    return layer_output(attrs, outputs=selected)
