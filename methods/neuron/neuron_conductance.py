"""Neuron Conductance: how much of the target's change flows through one neuron.

Dhamdhere et al. 2018, https://arxiv.org/abs/1805.12233. Along the input path, the input
gradient of the neuron times the target's gradient at the neuron, integrated and multiplied
by (inputs - baselines). Captum's default rule is ``riemann_trapezoid``; its weights sum to
(n-1)/n, ours are the true trapezoid weights, so ours = Captum's x n/(n-1) (the README lists
this difference).
"""

from __future__ import annotations

import torch
from pydantic import Field

from methods.engine import layers, neurons
from methods.engine.batching import forward_done
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.quadrature import ApproximationMethod
from methods.errors import InvalidArgumentError
from methods.neuron._common import NeuronPathParams, neuron_path, neuron_target
from methods.registry import register


class NeuronConductanceParams(NeuronPathParams):
    approximation_method: ApproximationMethod = Field(
        "riemann_trapezoid", description="quadrature rule along the path (Captum's default)"
    )


@register(
    "neuron_conductance",
    family="neuron",
    params=NeuronConductanceParams,
    needs_hooks=True,
    batching="internal_batch_size",
    token_counterpart=None,
)
def neuron_conductance(call: Call, p: NeuronConductanceParams) -> Output:
    """Conductance of the selected neuron, attributed to each input element."""
    module, selector = neuron_target(call, p)
    to_input = p.attribute_to_neuron_input

    def grad_fn(sub: Call, points: Tensors) -> Tensors:
        with torch.enable_grad(), layers.tap(module, p.layer, to_input=to_input) as t:
            leaves = tuple(pt.detach().requires_grad_(True) for pt in points)
            out = layers.run(sub.forward, leaves, t)
            selected = sub.target.select(out)  # type: ignore[arg-type]
            values = t.values
            forward_done()
            layer_grads = torch.autograd.grad(
                selected.sum(), values, retain_graph=True, allow_unused=True
            )
            layer_grads = tuple(
                torch.zeros_like(v) if g is None else g
                for g, v in zip(layer_grads, values, strict=True)
            )
            mid = neurons.select_neuron(layer_grads, selector)
            if mid.dim() == 0:
                raise InvalidArgumentError(
                    "neuron_conductance needs one neuron value per example: neuron_selector "
                    "(a callable) returned one value for the whole batch, which conductance "
                    "cannot split between the examples (Captum fails on it too); return one "
                    "value per example, e.g. lambda out: out.sum(1)",
                    argument="neuron_selector",
                )
            neuron = neurons.select_neuron(values, selector)
            grads = torch.autograd.grad(neuron.sum(), leaves, allow_unused=True)
        rows = points[0].shape[0]
        return tuple(
            torch.zeros_like(x) if g is None else g * mid.reshape(rows, *([1] * (g.dim() - 1)))
            for g, x in zip(grads, leaves, strict=True)
        )

    return neuron_path(call, p, grad_fn)
