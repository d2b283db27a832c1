"""Layer Conductance: the flow of the target's change through a layer along the input path.

Dhamdhere et al. 2018, https://arxiv.org/abs/1805.12233. At n_steps + 1 points of the rule,
sum_k (L(alpha_{k+1}) - L(alpha_k)) * dF/dL(alpha_k), as Captum computes it (the rule's
weights are not used, so there is no trapezoid difference here).
"""

from __future__ import annotations

from pydantic import Field

from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.path import completeness_delta, endpoint_outputs
from methods.engine.quadrature import ApproximationMethod
from methods.layer._common import LayerPathParams, layer_output, path_at_layer
from methods.registry import register


class LayerConductanceParams(LayerPathParams):
    n_steps: int = Field(50, ge=1, description="steps along the path (n_steps + 1 points)")
    approximation_method: ApproximationMethod = Field(
        "gausslegendre", description="rule whose n_steps + 1 points are used"
    )


@register(
    "layer_conductance",
    family="layer",
    params=LayerConductanceParams,
    needs_hooks=True,
    returns_delta=True,
    batching="internal_batch_size",
)
def layer_conductance(call: Call, p: LayerConductanceParams) -> Output:
    """Conductance of every unit of the layer (sums to f(inputs) - f(baselines) in the limit)."""
    k = p.n_steps + 1
    grads, values, _, echo = path_at_layer(call, p, k)
    n = call.n
    attrs = []
    for g, v in zip(grads, values, strict=True):
        g = g.reshape(k, n, *g.shape[1:])
        v = v.reshape(k, n, *v.shape[1:])
        attrs.append(((v[1:] - v[:-1]) * g[:-1]).sum(0))
    out = layer_output(tuple(attrs), echo=echo)
    if call.return_delta:
        xs = call.inputs
        fx, fb = endpoint_outputs(call, xs, format_baselines(call.baselines, xs))
        out.delta, out.outputs = completeness_delta(tuple(attrs), fx, fb), fx
    return out
