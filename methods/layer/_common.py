"""Parameters and helpers shared by the layer methods."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import nn

from methods.call import Call, Output
from methods.engine import layers
from methods.engine.inputs import Tensors
from methods.params import MethodParams


class LayerParams(MethodParams):
    layer: str = Field(
        ..., description="dotted path of the module to attribute to, as in model.get_submodule"
    )
    attribute_to_layer_input: bool = Field(
        False, description="attribute to the layer's input instead of its output"
    )


def target_layer(call: Call, p: LayerParams) -> nn.Module:
    return layers.resolve(call.model, p.layer)


def layer_output(attrs: Tensors, **kw: Any) -> Output:
    """A layer result: a tuple only when the layer has several tensors (Captum's rule)."""
    return Output(tuple(attrs), as_tuple=len(attrs) > 1, **kw)
