"""Parameters and helpers shared by the layer methods, and their one post-processing step:
``interpolate_to_input``, applied by ``methods.api`` through ``upsampler``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, Literal, get_args

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator
from torch import nn

from methods.engine import layers
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.quadrature import rule_tensors
from methods.errors import InvalidArgumentError
from methods.params import MethodParams, NoisySamplesParams, PathParams

#: ``F.interpolate`` modes (align_corners left unset, as Captum's ``LayerAttribution.interpolate``)
InterpolateMode = Literal[
    "nearest", "nearest-exact", "area", "linear", "bilinear", "bicubic", "trilinear"
]
#: the modes that fit one spatial rank only; the others take 1 to 3 spatial dims
_MODE_RANK = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


class LayerParams(MethodParams):
    """A layer method's parameters: the layer, and upsampling its attributions to the input."""

    layer: str | Annotated[list[str], Field(min_length=1)] = Field(
        ...,
        description="dotted path of the module to attribute to, as in model.get_submodule; "
        "or a list of paths (Captum's multi-layer form): the attributions are then a list, "
        "one entry per layer in the given order, each what that layer alone would give",
    )
    attribute_to_layer_input: bool = Field(
        False, description="attribute to the layer's input instead of its output"
    )
    interpolate_to_input: bool = Field(
        False,
        description="upsample the attributions (N, C', *S') to the first input's spatial size "
        "S (its dims after the channel dim) with F.interpolate, as Captum's "
        "LayerAttribution.interpolate does; e.g. a Grad-CAM map to the image's size. The "
        "layer needs as many spatial dims as the input",
    )

    @field_validator("layer")
    @classmethod
    def _once_each(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list):
            twice = sorted({p for p in v if v.count(p) > 1})
            if twice:
                raise ValueError(f"the list names {twice} more than once; name each layer once")
        return v

    @property
    def path(self) -> str:
        """The one layer a method runs on (``methods.attribute`` runs a list layer by layer,
        or hands it whole to ``methods.layer.multi``)."""
        if isinstance(self.layer, list):
            raise InvalidArgumentError(
                "this step takes one layer; a list of layers is attributed one by one",
                argument="layer",
            )
        return self.layer

    interpolate_mode: InterpolateMode = Field(
        "nearest",
        description="F.interpolate mode for interpolate_to_input: 'linear' needs 1 spatial "
        "dim, 'bilinear' and 'bicubic' 2, 'trilinear' 3",
    )


def target_layer(call: Call, p: LayerParams) -> nn.Module:
    return layers.resolve(call.model, p.path)


def layer_output(attrs: Tensors, **kw: Any) -> Output:
    """A layer result: a tuple only when the layer has several tensors (Captum's rule)."""
    return Output(tuple(attrs), as_tuple=len(attrs) > 1, **kw)


class GradientShapParams(NoisySamplesParams):
    stdevs: float = Field(0.0, ge=0, description="standard deviation of the input noise")


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


def upsampler(p: MethodParams, inputs: Tensors) -> Callable[[Output], Output] | None:
    """The ``interpolate_to_input`` step for a layer method's ``Output``; None where not asked.

    Every attribution tensor (N, C', *S') becomes (N, C', *S) with S the spatial size of
    ``inputs[0]`` (layer methods attribute to the layer, not per input, so the first input is
    the one they map onto). The delta and outputs are unchanged. The mode is checked against
    the input here, before the method runs; the layer's rank once its attributions exist.
    """
    if not isinstance(p, LayerParams) or not p.interpolate_to_input:
        return None
    x, mode = inputs[0], p.interpolate_mode
    size = tuple(int(s) for s in x.shape[2:])
    if not 1 <= len(size) <= 3:
        why = "no spatial dims" if not size else f"{len(size)} spatial dims (at most 3 resize)"
        raise InvalidArgumentError(
            f"interpolate_to_input: inputs[0] is {_shape(x.shape)}, with {why}; upsampling "
            "needs inputs shaped (N, C, *spatial)",
            argument="interpolate_to_input",
        )
    if _MODE_RANK.get(mode, len(size)) != len(size):
        fits = [m for m in get_args(InterpolateMode) if _MODE_RANK.get(m, len(size)) == len(size)]
        raise InvalidArgumentError(
            f"interpolate_mode {mode!r} needs {_MODE_RANK[mode]} spatial dim(s) and the input "
            f"{_shape(x.shape)} has {len(size)}; use one of {', '.join(fits)}",
            argument="interpolate_mode",
        )
    side = "input" if p.attribute_to_layer_input else "output"

    def upsample(out: Output) -> Output:
        attrs = []
        for i, a in enumerate(out.attributions):
            which = f"{side} tensor {i}" if len(out.attributions) > 1 else side
            what = f"the attributions at layer {p.path!r} (its {which}) are {_shape(a.shape)}"
            if a.dim() != x.dim():
                has = "no spatial dims" if a.dim() <= 2 else f"{a.dim() - 2} spatial dim(s)"
                raise InvalidArgumentError(
                    f"interpolate_to_input: {what}, with {has}; they cannot be upsampled to "
                    f"the input's {len(size)}-d spatial size {list(size)}",
                    argument="interpolate_to_input",
                )
            try:
                attrs.append(F.interpolate(a, size=size, mode=mode))
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                raise InvalidArgumentError(
                    f"interpolate_to_input: {what} ({a.dtype}) cannot be upsampled with "
                    f"mode {mode!r}: {exc}",
                    argument="interpolate_to_input",
                ) from None
        return dataclasses.replace(out, attributions=tuple(attrs))

    return upsample


def _shape(shape: Any) -> str:
    """A shape as messages print it, the batch dim as N: [N, 6, 4, 4]."""
    return "[" + ", ".join(["N", *(str(int(s)) for s in shape[1:])]) + "]"


class LayerPathParams(LayerParams, PathParams):
    """Layer methods that follow the path from the baselines to the inputs at a layer."""


def path_at_layer(
    call: Call, p: LayerPathParams, points: int
) -> tuple[Tensors, Tensors, torch.Tensor, dict[str, Any]]:
    """The target's gradients and the layer's values at ``points`` points of the rule
    (point-major: (points * N, ...)), the rule's weights, and the batching echo."""
    module = target_layer(call, p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    alphas, weights = rule_tensors(p.approximation_method, points, xs[0].dtype, xs[0].device)
    grads, values, echo = layers.layer_path(
        call, xs, bs, alphas, module, p.path, p.attribute_to_layer_input
    )
    return grads, values, weights, echo
