"""Layer DeepLiftShap: layer DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874. Each example is paired with every
baseline row (example-major, as Captum does) and the layer attributions averaged.
"""

from __future__ import annotations

from methods.cost import baseline_pairs_cost
from methods.engine import deeplift as dl
from methods.engine.call import Call, Output
from methods.engine.path import completeness_delta
from methods.layer._common import layer_output, target_layer
from methods.layer.layer_deeplift import LayerDeepLiftParams, layer_step
from methods.registry import register


@register(
    "layer_deeplift_shap",
    family="layer",
    params=LayerDeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    differentiates_inputs=False,
    cost=baseline_pairs_cost,
    baseline_distribution=True,
)
def layer_deeplift_shap(call: Call, p: LayerDeepLiftParams) -> Output:
    """Layer DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    step = layer_step(target_layer(call, p), p)
    sub, xs, bs, b = dl.baseline_pairs(call)
    attrs, fx, fb, echo = dl.run_rows(sub, xs, bs, sub.target, step, p.combiner())
    delta = completeness_delta(attrs, fx, fb)
    return layer_output(dl.pair_mean(attrs, b), delta=delta, outputs=fx[::b], echo=echo)
