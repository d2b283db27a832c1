"""Layer Feature Ablation: the output change when units of a layer are set to a baseline.

Captum's ``LayerFeatureAblation``: feature ablation (``methods.perturbation.feature_ablation``)
run on the layer's activations, each perturbed activation swapped in for the layer's real
output (or input) while the model runs on its original inputs. Forward-only, so token-id
inputs work as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field

from methods.cost import per_feature_cost
from methods.engine import layers
from methods.engine.call import Call, Output
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.params import TensorParam
from methods.perturbation.feature_ablation import FeatureAblationParams, feature_ablation
from methods.registry import register


class LayerFeatureAblationParams(LayerParams):
    layer_baselines: TensorParam = Field(
        None,
        description="the value ablated units take: a number or a tensor broadcastable to the "
        "layer's activation (a tuple for layers with several tensors); default 0",
    )
    layer_mask: TensorParam = Field(
        None,
        description="integer feature ids over the layer's activation (dim 0 of 1 or N); units "
        "sharing an id are ablated together. Default: every unit is its own feature",
    )


@register(
    "layer_feature_ablation",
    family="layer",
    params=LayerFeatureAblationParams,
    needs_hooks=True,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=per_feature_cost("layer_mask"),
    forward_only=True,
)
def layer_feature_ablation(call: Call, p: LayerFeatureAblationParams) -> Output:
    """Output change when each unit (group) of the layer is replaced by its baseline."""
    module = target_layer(call, p)
    to_input = p.attribute_to_layer_input
    acts = layers.activations(call.forward, call.inputs, module, p.path, to_input)
    xs, fn, n, count = call.inputs, call.forward.fn, call.n, len(acts)
    lay_out = call.forward.laid_out

    def swapped(*args: Any) -> Any:
        values, rest = args[:count], args[count:]
        k = int(values[0].shape[0]) // n
        with layers.tap(module, p.path, to_input=to_input, mode="swap", replacement=values) as t:
            out = fn(*lay_out(layers.tile(xs, k)), *rest)
        t.check_ran()
        return out

    sub = call.replace(
        forward=dataclasses.replace(call.forward, fn=swapped),
        inputs=acts,
        baselines=p.layer_baselines,
    )
    out = feature_ablation(sub, FeatureAblationParams(feature_mask=p.layer_mask))
    return layer_output(out.attributions, echo=out.echo)
