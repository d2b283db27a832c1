"""DeepLiftShap: DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874 (DeepSHAP). Each example is paired with
every baseline row (example-major, as Captum does) and the DeepLift attributions averaged.
"""

from __future__ import annotations

from methods.call import Call, Output
from methods.cost import baseline_pairs_cost
from methods.engine.baselines import format_baseline_distribution
from methods.gradient.deeplift import DeepLiftParams, run_rows
from methods.registry import TokenCounterpart, register


@register(
    "deeplift_shap",
    kind="gradient",
    params=DeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    cost=baseline_pairs_cost,
    merge="shared_baselines",
    token_counterpart=TokenCounterpart("layer_deeplift_shap"),
)
def deeplift_shap(call: Call, p: DeepLiftParams) -> Output:
    """DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    dist = format_baseline_distribution(call.baselines, call.inputs, "deeplift_shap")
    n, b = call.n, dist[0].shape[0]
    xs = tuple(x.repeat_interleave(b, dim=0) for x in call.inputs)
    bs = tuple(d.repeat((n,) + (1,) * (d.dim() - 1)) for d in dist)
    sub = call.replace(
        forward=call.forward.expanded(b, interleave=True),
        target=call.target.expand(b, interleave=True),
    )
    attrs, fx, _fb, delta, echo = run_rows(sub, xs, bs, sub.target, p)
    mean = tuple(a.reshape(n, b, *a.shape[1:]).mean(1) for a in attrs)
    return Output(mean, delta=delta, outputs=fx.reshape(n, b)[:, 0], echo=echo)
