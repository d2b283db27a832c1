"""Guided Grad-CAM: guided backpropagation times the upsampled (ReLU'd) Grad-CAM map.

Selvaraju et al. 2017, https://arxiv.org/abs/1610.02391. The Grad-CAM map of ``layer`` is
interpolated to each input's spatial size (dims after the channel dim) and multiplies the
guided-backprop gradients of that input; an input without spatial dims is scaled by the
(N, 1) map of a 2-D layer. Where Captum returns an empty tensor with a warning (an input the
map cannot be interpolated to), this raises an error naming the input.
"""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import Field

from methods.engine import intercept, layers
from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.errors import InvalidArgumentError
from methods.layer._common import InterpolateMode
from methods.layer.layer_gradcam import gradcam
from methods.params import MethodParams
from methods.registry import register


class GuidedGradCamParams(MethodParams):
    layer: str = Field(..., description="dotted path of the (convolutional) layer for Grad-CAM")
    attribute_to_layer_input: bool = Field(
        False, description="compute Grad-CAM on the layer's input instead of its output"
    )
    interpolate_mode: InterpolateMode = Field(
        "nearest", description="F.interpolate mode used to upsample the Grad-CAM map"
    )


@register(
    "guided_gradcam",
    family="gradient",
    params=GuidedGradCamParams,
    needs_hooks=True,
    token_counterpart=None,
)
def guided_gradcam(call: Call, p: GuidedGradCamParams) -> Output:
    """Guided backpropagation masked by the layer's upsampled Grad-CAM map."""
    module = layers.resolve(call.model, p.layer)
    lgrads, values, _ = layers.layer_gradients(
        call.forward, call.inputs, call.target, module, p.layer, p.attribute_to_layer_input
    )
    if len(values) != 1:
        raise InvalidArgumentError(
            f"guided_gradcam needs a layer with one tensor; {p.layer!r} has {len(values)}",
            argument="layer",
        )
    (cam,) = gradcam(lgrads, values, relu=True, summation=True)
    forward = intercept.ruled(call.forward, intercept.GUIDED_BACKPROP)
    gbp, selected = gradients(forward, call.inputs, call.target)
    out = []
    for i, (g, x) in enumerate(zip(gbp, call.inputs, strict=True)):
        size = tuple(x.shape[2:])
        if not size and cam.dim() == 2:  # no spatial dims: the (N, 1) map scales each example
            out.append(g * cam)
            continue
        try:
            up = F.interpolate(cam, size=size, mode=p.interpolate_mode)
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            raise InvalidArgumentError(
                f"the Grad-CAM map {tuple(cam.shape)} cannot be interpolated to inputs[{i}]'s "
                f"spatial size {size} with mode {p.interpolate_mode!r}: {exc}",
                argument="interpolate_mode",
            ) from None
        out.append(g * up)
    return Output(tuple(out), outputs=selected)
