"""Parameters and helpers shared by the neuron methods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import Field, WithJsonSchema
from torch import nn

from methods.engine import intercept, layers, neurons
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Forward, Tensors
from methods.engine.intercept import Composite
from methods.engine.path import path_gradient_sum
from methods.engine.quadrature import rule_tensors
from methods.params import MethodParams, MultiplyByInputsParams, PathParams

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
        "a callable layer_output -> one value per example, or one 0-d value for the whole "
        "batch (Captum's aggregate form, e.g. lambda out: out.sum())",
    )
    attribute_to_neuron_input: bool = Field(
        False, description="select the neuron from the layer's input instead of its output"
    )


GradFn = Callable[[Call, Tensors], Tensors]


def neuron_target(call: Call, p: NeuronParams) -> tuple[nn.Module, Any]:
    return layers.resolve(call.model, p.layer), neurons.check_selector(p.neuron_selector)


def neuron_grad_fn(
    module: nn.Module,
    p: NeuronParams,
    selector: Any,
    wrap: Callable[[Forward], Forward] | None = None,
) -> GradFn:
    """A ``path_gradient_sum`` gradient function: d(neuron)/d(points), target ignored."""

    def fn(sub: Call, points: Tensors) -> Tensors:
        forward = sub.forward if wrap is None else wrap(sub.forward)
        grads, _ = neurons.neuron_gradients(
            forward, points, module, p.layer, p.attribute_to_neuron_input, selector
        )
        return grads

    return fn


def ruled_neuron_gradients(call: Call, p: NeuronParams, composite: Composite) -> Output:
    """The selected neuron's gradient w.r.t. the inputs with ``composite``'s backward rules
    (neuron guided backprop and neuron deconvolution)."""
    module, selector = neuron_target(call, p)
    forward = intercept.ruled(call.forward, composite)
    grads, _ = neurons.neuron_gradients(
        forward, call.inputs, module, p.layer, p.attribute_to_neuron_input, selector
    )
    return Output(grads)


class NeuronPathParams(NeuronParams, PathParams, MultiplyByInputsParams):
    """Neuron methods integrating along the path from the baselines to the inputs."""


def neuron_path(call: Call, p: NeuronPathParams, grad_fn: GradFn) -> Output:
    """sum_k w_k grad_fn(b + a_k (x - b)), times (x - b) unless ``multiply_by_inputs`` is off."""
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    alphas, weights = rule_tensors(p.approximation_method, p.n_steps, xs[0].dtype, xs[0].device)
    grads, echo = path_gradient_sum(call, xs, bs, alphas, weights, grad_fn=grad_fn)
    if p.multiply_by_inputs:
        grads = tuple((x - b) * g for x, b, g in zip(xs, bs, grads, strict=True))
    return Output(grads, echo=echo)
