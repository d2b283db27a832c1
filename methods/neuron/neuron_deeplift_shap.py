"""Neuron DeepLiftShap: neuron DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874 (DeepSHAP), for one neuron of a layer.
"""

from __future__ import annotations

from methods.cost import baseline_pairs_cost
from methods.engine import deeplift as dl
from methods.engine.call import Call, Output
from methods.neuron.neuron_deeplift import NeuronDeepLiftParams, neuron_deeplift_rows
from methods.registry import register


@register(
    "neuron_deeplift_shap",
    family="neuron",
    params=NeuronDeepLiftParams,
    needs_hooks=True,
    cost=baseline_pairs_cost,
    baseline_distribution=True,
    needs_target=False,
    token_counterpart=None,
)
def neuron_deeplift_shap(call: Call, p: NeuronDeepLiftParams) -> Output:
    """Neuron DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    sub, xs, bs, b = dl.baseline_pairs(call)
    return Output(dl.pair_mean(neuron_deeplift_rows(sub, p, xs, bs), b))
