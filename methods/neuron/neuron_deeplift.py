"""Neuron DeepLift: DeepLift (Rescale rule) of one neuron of a layer.

Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685, with the neuron in place of the
model output; every non-linear call is intercepted, functional or module, reused or not.
"""

from __future__ import annotations

from methods.engine import deeplift as dl
from methods.engine import layers, neurons
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.gradient.deeplift import DeepLiftParams
from methods.neuron._common import NeuronParams, neuron_target
from methods.registry import register


class NeuronDeepLiftParams(NeuronParams, DeepLiftParams):
    pass


def neuron_deeplift_rows(call: Call, p: NeuronDeepLiftParams, xs: Tensors, bs: Tensors) -> Tensors:
    module, selector = neuron_target(call, p)
    with layers.tap(module, p.layer, to_input=p.attribute_to_neuron_input) as t:
        t.reset()
        mults, _, _ = dl.multipliers(
            call, xs, bs, call.target, p.eps,
            grad_fn=lambda out: neurons.select_neuron(t.values, selector),
        )  # fmt: skip
        t.check_ran()
    return p.combiner()(mults, xs, bs)


@register(
    "neuron_deeplift",
    family="neuron",
    params=NeuronDeepLiftParams,
    needs_hooks=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_deeplift(call: Call, p: NeuronDeepLiftParams) -> Output:
    """DeepLift attributions of the selected neuron against the baselines (default zeros)."""
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    return Output(neuron_deeplift_rows(call, p, xs, bs))
