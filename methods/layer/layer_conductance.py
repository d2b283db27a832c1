"""Layer Conductance: the flow of the target's change through a layer along the input path.

Dhamdhere et al. 2018, https://arxiv.org/abs/1805.12233. At n_steps + 1 points of the rule,
sum_k (L(alpha_{k+1}) - L(alpha_k)) * dF/dL(alpha_k), as Captum computes it (the rule's
weights are not used, so there is no trapezoid difference here).
"""

from __future__ import annotations

from pydantic import Field

from methods.call import Call, Output
from methods.engine import layers
from methods.engine.baselines import format_baselines
from methods.engine.path import completeness_delta, endpoint_outputs
from methods.engine.quadrature import ApproximationMethod, rule_tensors
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class LayerConductanceParams(LayerParams):
    n_steps: int = Field(50, ge=1, description="steps along the path (n_steps + 1 points)")
    approximation_method: ApproximationMethod = Field(
        "gausslegendre", description="rule whose n_steps + 1 points are used"
    )


@register(
    "layer_conductance",
    kind="layer",
    params=LayerConductanceParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
)
def layer_conductance(call: Call, p: LayerConductanceParams) -> Output:
    """Conductance of every unit of the layer (sums to f(inputs) - f(baselines) in the limit)."""
    module = target_layer(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    k = p.n_steps + 1
    alphas, _ = rule_tensors(p.approximation_method, k, xs[0].dtype, xs[0].device)
    grads, values, echo = layers.layer_path(
        call, xs, bs, alphas, module, p.layer, p.attribute_to_layer_input
    )
    n = call.n
    attrs = []
    for g, v in zip(grads, values, strict=True):
        g = g.reshape(k, n, *g.shape[1:])
        v = v.reshape(k, n, *v.shape[1:])
        attrs.append(((v[1:] - v[:-1]) * g[:-1]).sum(0))
    out = layer_output(tuple(attrs), echo=echo)
    if call.return_delta:
        fx, fb = endpoint_outputs(call, xs, bs)
        out.delta, out.outputs = completeness_delta(tuple(attrs), fx, fb), fx
    return out
