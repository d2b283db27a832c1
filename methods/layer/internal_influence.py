"""Internal Influence: the target's gradient at a layer, integrated along the input path.

Leino et al. 2018, https://arxiv.org/abs/1802.03788. Like integrated gradients on the inputs,
but the gradient is taken with respect to the layer and not multiplied by any difference.
"""

from __future__ import annotations

import torch

from methods.engine.call import Call, Output
from methods.layer._common import LayerPathParams, layer_output, path_at_layer
from methods.registry import register


class InternalInfluenceParams(LayerPathParams):
    pass


@register(
    "internal_influence",
    family="layer",
    params=InternalInfluenceParams,
    needs_hooks=True,
    batching="internal_batch_size",
)
def internal_influence(call: Call, p: InternalInfluenceParams) -> Output:
    """Path-integrated gradient of the targeted output with respect to the layer."""
    grads, _, weights, echo = path_at_layer(call, p, p.n_steps)
    n, k = call.n, p.n_steps
    attrs = tuple(
        torch.tensordot(weights.to(g.dtype), g.reshape(k, -1), dims=1).reshape(n, *g.shape[1:])
        for g in grads
    )
    return layer_output(attrs, echo=echo)
