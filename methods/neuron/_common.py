"""Parameters and helpers shared by the neuron methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema
from torch import nn

from methods.call import Call
from methods.engine import layers
from methods.engine.inputs import Forward, Tensors
from methods.params import MethodParams

NeuronSelector = Annotated[
    Any,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer"},
                {"type": "array", "items": {"type": "integer"}, "minItems": 1},
            ],
        }
    ),
]


class NeuronParams(MethodParams):
    layer: str = Field(
        ..., description="dotted path of the module holding the neuron, as in get_submodule"
    )
    neuron_selector: NeuronSelector = Field(
        ...,
        description="the neuron: an index into the layer's output without the batch dim (an "
        "int or a list of ints); Python callers may also pass a tuple with slices (summed) or "
        "a callable layer_output -> one value per example",
    )
    attribute_to_neuron_input: bool = Field(
        False, description="select the neuron from the layer's input instead of its output"
    )


GradFn = Callable[[Call, Tensors], Tensors]


def neuron_target(call: Call, p: NeuronParams) -> tuple[nn.Module, Any]:
    return layers.resolve(call.model, p.layer), layers.check_selector(p.neuron_selector)


def neuron_grad_fn(
    module: nn.Module,
    p: NeuronParams,
    selector: Any,
    wrap: Callable[[Forward], Forward] | None = None,
) -> GradFn:
    """A ``path_gradient_sum`` gradient function: d(neuron)/d(points), target ignored."""

    def fn(sub: Call, points: Tensors) -> Tensors:
        forward = sub.forward if wrap is None else wrap(sub.forward)
        grads, _ = layers.neuron_gradients(
            forward, points, module, p.layer, p.attribute_to_neuron_input, selector
        )
        return grads

    return fn
