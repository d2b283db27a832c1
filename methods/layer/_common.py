"""Parameters and helpers shared by the layer methods."""

from __future__ import annotations

from typing import Any

from pydantic import Field
from torch import nn

from methods.call import Call, Output
from methods.engine import layers
from methods.engine.inputs import Tensors
from methods.params import MethodParams


class LayerParams(MethodParams):
    layer: str = Field(
        ..., description="dotted path of the module to attribute to, as in model.get_submodule"
    )
    attribute_to_layer_input: bool = Field(
        False, description="attribute to the layer's input instead of its output"
    )


def target_layer(call: Call, p: LayerParams) -> nn.Module:
    return layers.resolve(call.model, p.layer)


def layer_output(attrs: Tensors, **kw: Any) -> Output:
    """A layer result: a tuple only when the layer has several tensors (Captum's rule)."""
    return Output(tuple(attrs), as_tuple=len(attrs) > 1, **kw)


class GradientShapParams(MethodParams):
    n_samples: int = Field(5, ge=1, description="random samples per example")
    stdevs: float = Field(0.0, ge=0, description="standard deviation of the input noise")
    multiply_by_inputs: bool = Field(
        True, description="multiply the gradients by the (noisy input - baseline) difference"
    )


def shap_samples(
    call: Call, n_samples: int, stdevs: float, method: str
) -> tuple[Call, Tensors, Tensors, Tensors]:
    """GradientShap's random rows, N * n_samples of them, each example's rows together.

    Returns the expanded call, the noisy inputs, the drawn baseline rows and the points
    b + alpha (x_noisy - b) with alpha ~ U(0, 1).
    """
    from methods.engine.baselines import format_baseline_distribution

    xs = call.inputs
    dist = format_baseline_distribution(call.baselines, xs, method)
    n, k = call.n, n_samples
    rows = n * k
    idx = call.randint(dist[0].shape[0], (rows,), xs[0].device)
    noisy = tuple(
        x.repeat_interleave(k, dim=0)
        + (call.randn((rows, *x.shape[1:]), x) * stdevs if stdevs > 0 else 0)
        for x in xs
    )
    bs = tuple(d[idx] for d in dist)
    alphas = call.rand((rows,), xs[0])
    points = tuple(
        b + alphas.view(-1, *([1] * (x.dim() - 1))) * (x - b)
        for x, b in zip(noisy, bs, strict=True)
    )
    sub = call.replace(
        inputs=noisy,
        forward=call.forward.expanded(k, interleave=True),
        target=call.target.expand(k, interleave=True),
    )
    return sub, noisy, bs, points
