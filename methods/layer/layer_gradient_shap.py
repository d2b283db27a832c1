"""Layer GradientShap: expected gradients at a layer over random baselines and path points.

Lundberg & Lee 2017, https://arxiv.org/abs/1705.07874. Per example, ``n_samples`` rows each
draw a baseline row, Gaussian input noise (``stdevs``) and alpha ~ U(0, 1); the attribution is
the mean over rows of (L(x_noisy) - L(b)) * dF/dL at b + alpha (x_noisy - b). Sampling uses
torch's generator (seedable), so values agree with Captum's in distribution.
"""

from __future__ import annotations

import torch

from methods.engine import layers
from methods.engine.call import Call, Output
from methods.layer._common import (
    GradientShapParams,
    LayerParams,
    layer_output,
    shap_samples,
    target_layer,
)
from methods.registry import register


class LayerGradientShapParams(LayerParams, GradientShapParams):
    pass


@register(
    "layer_gradient_shap",
    family="layer",
    params=LayerGradientShapParams,
    needs_hooks=True,
    returns_delta=True,
    stochastic=True,
    baseline_distribution=True,
)
def layer_gradient_shap(call: Call, p: LayerGradientShapParams) -> Output:
    """SHAP values of the layer's units, approximated by gradients at random path points."""
    module = target_layer(call, p)
    sub, noisy, bs, points = shap_samples(call, p.n_samples, p.stdevs, "layer_gradient_shap")
    to_input = p.attribute_to_layer_input
    grads, _, _ = layers.layer_gradients(sub.forward, points, sub.target, module, p.path, to_input)
    rows = points[0].shape[0]
    both = tuple(torch.cat([x, b]) for x, b in zip(noisy, bs, strict=True))
    with torch.no_grad(), layers.tap(module, p.path, to_input=to_input) as t:
        out = layers.run(sub.forward.expanded(2), both, t)
    vx = tuple(v[:rows] for v in t.values)
    vb = tuple(v[rows:] for v in t.values)
    if p.multiply_by_inputs:
        per_row = tuple((x - b) * g for x, b, g in zip(vx, vb, grads, strict=True))
    else:
        per_row = grads
    n, k = call.n, p.n_samples
    attrs = tuple(a.reshape(n, k, *a.shape[1:]).mean(1) for a in per_row)
    sel = sub.target.expand(2).select(out)  # type: ignore[arg-type]
    total = sum(a.reshape(rows, -1).sum(1) for a in per_row)
    return layer_output(attrs, delta=total - (sel[:rows] - sel[rows:]))
