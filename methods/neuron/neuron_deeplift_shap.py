"""Neuron DeepLiftShap: neuron DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874 (DeepSHAP), for one neuron of a layer.
"""

from __future__ import annotations

from methods.call import Call, Output
from methods.cost import baseline_pairs_cost
from methods.engine.baselines import format_baseline_distribution
from methods.neuron.neuron_deeplift import NeuronDeepLiftParams, neuron_deeplift_rows
from methods.registry import register


@register(
    "neuron_deeplift_shap",
    kind="neuron",
    params=NeuronDeepLiftParams,
    needs_hooks=True,
    cost=baseline_pairs_cost,
    merge="shared_baselines",
    needs_target=False,
    token_counterpart=None,
)
def neuron_deeplift_shap(call: Call, p: NeuronDeepLiftParams) -> Output:
    """Neuron DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    dist = format_baseline_distribution(call.baselines, call.inputs, "neuron_deeplift_shap")
    n, b = call.n, dist[0].shape[0]
    xs = tuple(x.repeat_interleave(b, dim=0) for x in call.inputs)
    bs = tuple(d.repeat((n,) + (1,) * (d.dim() - 1)) for d in dist)
    sub = call.replace(
        forward=call.forward.expanded(b, interleave=True),
        target=call.target.expand(b, interleave=True),
    )
    attrs = neuron_deeplift_rows(sub, p, xs, bs)
    return Output(tuple(a.reshape(n, b, *a.shape[1:]).mean(1) for a in attrs))
