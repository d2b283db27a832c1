"""Blur integrated gradients: integrated gradients along a path of ever blurrier images.

Xu et al. 2020, https://arxiv.org/abs/2004.03383, as PAIR's ``saliency`` 0.2.1 ``BlurIG``
computes it: the path runs from the image (sigma 0) towards its Gaussian blur of
``max_sigma`` in ``n_steps`` steps (sigmas evenly spaced, or their square roots with
``sqrt``); at each step the path's direction is the blur's derivative in sigma, a forward
difference of ``grad_step``, and the answer is minus the sum of
``(sigma[k+1] - sigma[k]) * d blur / d sigma * grad f`` over the steps. The blur is SciPy's
``gaussian_filter`` over the image's height and width (``mode="constant"``: zeros beyond the
edge, the kernel truncated at 4 sigma), here one matrix product per axis.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from torch import Tensor

from methods.engine.batching import run_chunks
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.path import add_each, plain_gradients, steps_per_chunk
from methods.errors import InvalidArgumentError
from methods.params import MethodParams, PositiveInt
from methods.registry import register

#: SciPy's gaussian_filter default: the kernel stops at 4 standard deviations
TRUNCATE = 4.0


class BlurIGParams(MethodParams):
    max_sigma: float = Field(50.0, gt=0, description="the blur at the path's far end (pixels)")
    n_steps: PositiveInt = Field(100, description="steps from the image to its blurriest")
    grad_step: float = Field(
        0.01, gt=0, description="the sigma step of the blur's derivative (forward difference)"
    )
    sqrt: bool = Field(False, description="space the sigmas as square roots of even steps")


def blur_matrix(size: int, sigma: float, device: torch.device) -> Tensor:
    """The ``size`` x ``size`` float64 matrix of SciPy's 1-D Gaussian filter with zeros beyond
    the edges: ``(B @ v)[i] = sum_j phi[j - i] v[j]``, ``phi`` the normalised kernel of radius
    ``int(4 sigma + 0.5)``; the identity for sigma 0."""
    if sigma <= 0:
        return torch.eye(size, dtype=torch.float64, device=device)
    radius = int(TRUNCATE * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=torch.float64, device=device)
    phi = torch.exp(-0.5 / (sigma * sigma) * x * x)
    phi = phi / phi.sum()
    offsets = torch.arange(size, device=device)
    d = offsets[None, :] - offsets[:, None]  # j - i
    inside = d.abs() <= radius
    taps = phi[(d + radius).clamp(0, 2 * radius)]
    return torch.where(inside, taps, torch.zeros((), dtype=phi.dtype, device=device))


def blurred(x: Tensor, sigma: float) -> Tensor:
    """``x`` (``[N, C, H, W]`` or ``[N, H, W]``) blurred over its last two dims by a Gaussian
    of ``sigma``, in float64 (the path's slope is a difference of two blurs over a small
    step: in float32 it would keep few digits)."""
    x64 = x.to(torch.float64)
    if sigma == 0:
        return x64
    h, w = x.shape[-2:]
    rows, cols = blur_matrix(h, sigma, x.device), blur_matrix(w, sigma, x.device)
    return rows @ x64 @ cols.T


def sigmas(p: BlurIGParams) -> list[float]:
    """The path's sigmas, ``n_steps + 1`` of them from 0 to ``max_sigma``."""
    steps = p.n_steps
    if p.sqrt:
        return [math.sqrt(float(i) * p.max_sigma / float(steps)) for i in range(steps + 1)]
    return [float(i) * p.max_sigma / float(steps) for i in range(steps + 1)]


def image_input(call: Call, method: str) -> Tensor:
    """The one image input of an image-only method: ``[N, C, H, W]`` or ``[N, H, W]``."""
    xs = call.inputs
    if len(xs) != 1 or xs[0].dim() not in (3, 4):
        shapes = ", ".join(str(list(x.shape)) for x in xs)
        raise InvalidArgumentError(
            f"{method} attributes one image input, [N, C, H, W] or [N, H, W]; got {shapes}",
            argument="inputs",
        )
    return xs[0]


@register(
    "blur_ig",
    family="gradient",
    params=BlurIGParams,
    batching="internal_batch_size",
    token_counterpart=None,
    images_only=True,
)
def blur_ig(call: Call, p: BlurIGParams) -> Output:
    """Integrated gradients along a path of blurrier and blurrier copies of each image (PAIR
    saliency's BlurIG): no baseline, the blurriest image stands for it."""
    x = image_input(call, "blur_ig")
    if call.baselines is not None:
        raise InvalidArgumentError(
            "blur_ig takes no baselines: its path ends at the image blurred by max_sigma",
            argument="baselines",
        )
    s = sigmas(p)
    n = call.n
    per_chunk = steps_per_chunk(call, p.n_steps, (x,), plain_gradients)
    expanded: dict[int, Call] = {}

    def chunk(start: int, end: int) -> Tensors:
        k = end - start
        sub = expanded.get(k)
        if sub is None:
            sub = expanded[k] = call.expanded(k)
        points, slopes = [], []
        for i in range(start, end):
            here = blurred(x, s[i])
            points.append(here.to(x.dtype))
            step = s[i + 1] - s[i]
            slope = step * (blurred(x, s[i] + p.grad_step) - here) / p.grad_step
            slopes.append(slope.to(x.dtype))
        grads = plain_gradients(sub, (torch.cat(points),))[0]
        weighted = torch.stack(slopes) * grads.reshape(k, *x.shape)
        return (weighted.sum(0),)

    retry = call.internal_batch_size == "auto"
    total, used = run_chunks(p.n_steps, per_chunk, chunk, retry_oom=retry, reduce=add_each)
    return Output((-total[0],), echo={"internal_batch_size": used * n})
