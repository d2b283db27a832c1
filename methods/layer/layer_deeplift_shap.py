"""Layer DeepLiftShap: layer DeepLift averaged over a distribution of baselines.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874. Each example is paired with every
baseline row (example-major, as Captum does) and the layer attributions averaged.
"""

from __future__ import annotations

from methods.call import Call, Output
from methods.cost import baseline_pairs_cost
from methods.engine.baselines import format_baseline_distribution
from methods.layer._common import layer_output, target_layer
from methods.layer.layer_deeplift import LayerDeepLiftParams, delta, run_layer_rows
from methods.registry import register


@register(
    "layer_deeplift_shap",
    kind="layer",
    params=LayerDeepLiftParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
    differentiates_inputs=False,
    cost=baseline_pairs_cost,
    merge="shared_baselines",
)
def layer_deeplift_shap(call: Call, p: LayerDeepLiftParams) -> Output:
    """Layer DeepLift averaged over baseline rows (baselines: B reference rows per input)."""
    module = target_layer(call, p)
    dist = format_baseline_distribution(call.baselines, call.inputs, "layer_deeplift_shap")
    n, b = call.n, dist[0].shape[0]
    xs = tuple(x.repeat_interleave(b, dim=0) for x in call.inputs)
    bs = tuple(d.repeat((n,) + (1,) * (d.dim() - 1)) for d in dist)
    sub = call.replace(
        forward=call.forward.expanded(b, interleave=True),
        target=call.target.expand(b, interleave=True),
    )
    attrs, fx, fb, echo = run_layer_rows(sub, xs, bs, sub.target, module, p)
    mean = tuple(a.reshape(n, b, *a.shape[1:]).mean(1) for a in attrs)
    return layer_output(mean, delta=delta(attrs, fx, fb), outputs=fx.reshape(n, b)[:, 0], echo=echo)
