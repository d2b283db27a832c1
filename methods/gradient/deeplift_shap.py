"""DeepLiftShap: DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874 (DeepSHAP). Each example is paired with
every baseline row (example-major, as Captum does) and the DeepLift attributions averaged.
"""

from __future__ import annotations

from methods.cost import baseline_pairs_cost
from methods.engine import deeplift as dl
from methods.engine.call import Call, Output
from methods.engine.path import completeness_delta
from methods.gradient.deeplift import DeepLiftParams
from methods.registry import TokenCounterpart, register


@register(
    "deeplift_shap",
    family="gradient",
    params=DeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    cost=baseline_pairs_cost,
    baseline_distribution=True,
    token_counterpart=TokenCounterpart("layer_deeplift_shap"),
)
def deeplift_shap(call: Call, p: DeepLiftParams) -> Output:
    """DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    sub, xs, bs, b = dl.baseline_pairs(call)
    attrs, fx, fb, echo = dl.run_rows(sub, xs, bs, sub.target, dl.input_step(p.eps), p.combiner())
    delta = completeness_delta(attrs, fx, fb)
    return Output(dl.pair_mean(attrs, b), delta=delta, outputs=fx[::b], echo=echo)
