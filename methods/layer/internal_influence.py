"""Internal Influence: the target's gradient at a layer, integrated along the input path.

Leino et al. 2018, https://arxiv.org/abs/1802.03788. Like integrated gradients on the inputs,
but the gradient is taken with respect to the layer and not multiplied by any difference.
"""

from __future__ import annotations

import torch
from pydantic import Field

from methods.call import Call, Output
from methods.engine import layers
from methods.engine.baselines import format_baselines
from methods.engine.quadrature import ApproximationMethod, rule_tensors
from methods.layer._common import LayerParams, layer_output, target_layer
from methods.registry import register


class InternalInfluenceParams(LayerParams):
    n_steps: int = Field(50, ge=1, description="integration points along the path")
    approximation_method: ApproximationMethod = Field(
        "gausslegendre", description="quadrature rule along the path"
    )


@register(
    "internal_influence",
    kind="layer",
    params=InternalInfluenceParams,
    needs_hooks=True,
    batching="internal_batch_size",
)
def internal_influence(call: Call, p: InternalInfluenceParams) -> Output:
    """Path-integrated gradient of the targeted output with respect to the layer."""
    module = target_layer(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    alphas, weights = rule_tensors(p.approximation_method, p.n_steps, xs[0].dtype, xs[0].device)
    grads, _, echo = layers.layer_path(
        call, xs, bs, alphas, module, p.layer, p.attribute_to_layer_input
    )
    n, k = call.n, p.n_steps
    attrs = tuple(
        torch.tensordot(weights.to(g.dtype), g.reshape(k, -1), dims=1).reshape(n, *g.shape[1:])
        for g in grads
    )
    return layer_output(attrs, echo=echo)
