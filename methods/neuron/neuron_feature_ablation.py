"""Neuron Feature Ablation: the change of one neuron when input features are ablated.

Captum's ``NeuronFeatureAblation``: feature ablation (``methods.perturbation.feature_ablation``)
with the selected neuron as the output; each forward stops once the layer has run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from methods.cost import per_feature_cost
from methods.engine import layers, neurons
from methods.engine.call import Call, Output
from methods.engine.inputs import Forward
from methods.engine.targets import NONE
from methods.neuron._common import NeuronParams, neuron_target
from methods.params import FeatureMaskParams
from methods.perturbation.feature_ablation import FeatureAblationParams, feature_ablation
from methods.registry import register


class NeuronFeatureAblationParams(NeuronParams, FeatureMaskParams):
    pass


@register(
    "neuron_feature_ablation",
    family="neuron",
    params=NeuronFeatureAblationParams,
    needs_hooks=True,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=per_feature_cost(),
    needs_target=False,
    forward_only=True,
)
def neuron_feature_ablation(call: Call, p: NeuronFeatureAblationParams) -> Output:
    """Change of the selected neuron when each input feature is replaced by its baseline."""
    module, selector = neuron_target(call, p)
    fn, to_input = call.forward.fn, p.attribute_to_neuron_input

    def neuron(*args: Any) -> Any:
        with layers.tap(module, p.layer, to_input=to_input, stop=True) as t:
            layers.run(Forward(fn, ()), args, t)
        return neurons.select_neuron(t.values, selector)

    # the perturbed inputs reach the model laid out as the call's (``methods.engine.layout``)
    sub = call.replace(forward=dataclasses.replace(call.forward, fn=neuron), target=NONE)
    out = feature_ablation(sub, FeatureAblationParams(feature_mask=p.feature_mask))
    return Output(out.attributions, echo=out.echo)
