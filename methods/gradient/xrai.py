"""XRAI: integrated gradients gathered into the image regions that explain the most.

Kapishnikov et al. 2019, https://arxiv.org/abs/1906.02825, as PAIR's ``saliency`` 0.2.1
``XRAI`` computes it. Integrated gradients from two baselines, an image of the example's
smallest value and one of its largest (``n_steps`` points from 0 to 1 inclusive, each weighed
1/n), averaged and maxed over the channels, are credited to regions: by default the
Felzenszwalb segments of the image at six scales (taken on the image scaled to [-1, 1] and
resized to 224 px, each dilated by a disk of 5 px), or the ``segments`` given (an integer map,
or a superpixels spec). ``algorithm="full"`` adds, again and again, the region whose new pixels
have the highest mean attribution; ``"fast"`` ranks the regions once by their own mean. Each
pixel gets the gain of the region that first covered it; the answer's ``segments`` rank the
regions (1 the most important).

The greedy step keeps each region's count and sum of uncovered attribution up to date as
regions are added (every pixel is subtracted once), so a round costs one pass over the
regions, not over their pixels; the regions within a hair of the best are re-measured exactly
(the mean over their new pixels), so the choice is the one the reference's fresh means make.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field
from torch import Tensor

from methods.engine import superpixels
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.path import path_gradient_sum
from methods.errors import InvalidArgumentError
from methods.gradient.blur_ig import image_input
from methods.params import MaskParam, MethodParams, PositiveInt
from methods.registry import register

SCALES = (50, 100, 150, 250, 500, 1200)
SIGMA = 0.8
MIN_SIZE = 150
RESIZE = (224, 224)
DILATION = 5
#: candidates whose running gain is this close to the best (relative) are measured afresh
NEAR = 1e-9


class XRAIParams(MethodParams):
    n_steps: PositiveInt = Field(100, description="integrated gradients' points per baseline")
    algorithm: Literal["full", "fast"] = Field(
        "full", description="full: regions re-ranked after each is added; fast: ranked once"
    )
    segments: MaskParam = Field(
        None,
        description="the candidate regions: an integer map [H, W] (or one per example, "
        '[N, H, W]), or {"superpixels": {...}}; default Felzenszwalb at six scales, dilated',
    )
    area_threshold: float = Field(
        1.0,
        gt=0,
        le=1,
        description="full only: stop adding regions once they cover this share of the image "
        "(the rest is one region)",
    )
    min_pixel_diff: int = Field(
        50, ge=1, description="skip a region adding fewer new pixels than this"
    )


def _cost(p: Any, shape: Any) -> int:
    return 2 * int(p.n_steps)  # two baselines


@register(
    "xrai",
    family="gradient",
    params=XRAIParams,
    batching="internal_batch_size",
    cost=_cost,
    token_counterpart=None,
    images_only=True,
)
def xrai(call: Call, p: XRAIParams) -> Output:
    """Integrated gradients credited to image regions ranked by attribution density (PAIR
    saliency's XRAI); the answer is per pixel, ``[N, 1, H, W]``, and its regions ranked."""
    x = image_input(call, "xrai")
    attr, used = _integrated_gradients(call, x, p.n_steps)
    if x.dim() == 4:
        attr = attr.max(dim=1).values  # the channels' largest, as the reference
    given = _given_segments(p.segments, x)
    maps, ranks = [], []
    for i in range(call.n):
        image = x[i].detach().cpu().numpy()
        masks = given[i] if given is not None else default_masks(image)
        a = attr[i].detach().cpu().numpy().astype(np.float64)
        if not np.isfinite(a).all():
            raise InvalidArgumentError(
                f"example {i}'s integrated gradients are not finite (NaN or infinite): the "
                "model's gradients overflow on this input",
                argument="inputs",
            )
        out, rank = ranked(a, masks, p)
        maps.append(torch.from_numpy(out))
        ranks.append(torch.from_numpy(rank))
    result = torch.stack(maps).to(device=x.device, dtype=x.dtype).unsqueeze(1)
    return Output(
        (result,),
        segments=torch.stack(ranks).to(x.device),
        echo={"internal_batch_size": used},
    )


def _integrated_gradients(call: Call, x: Tensor, n_steps: int) -> tuple[Tensor, Any]:
    """The mean of integrated gradients from each baseline: the given one, else the example's
    minimum and its maximum (PAIR's points: 0 to 1 inclusive, each weighed 1/n)."""
    if call.baselines is not None:
        bases = [format_baselines(call.baselines, (x,))[0]]
    else:
        flat = x.detach().reshape(call.n, -1)
        shape = (call.n, *([1] * (x.dim() - 1)))
        low = flat.min(dim=1).values.reshape(shape).expand_as(x)
        high = flat.max(dim=1).values.reshape(shape).expand_as(x)
        bases = [low.contiguous(), high.contiguous()]
    alphas = torch.linspace(0, 1, n_steps, dtype=torch.float64, device=x.device)
    weights = torch.full((n_steps,), 1.0 / n_steps, dtype=torch.float64, device=x.device)
    parts, used = [], None
    for b in bases:
        grads, echo = path_gradient_sum(call, (x,), (b,), alphas.to(x.dtype), weights)
        parts.append(grads[0] * (x - b))
        used = echo["internal_batch_size"]
    return torch.stack(parts).mean(dim=0), used


def _given_segments(value: Any, x: Tensor) -> list[list[np.ndarray]] | None:
    """The caller's regions, per example: each integer map's segments as masks (ids from its
    smallest to its largest, as the reference unpacks them)."""
    if value is None:
        return None
    if superpixels.is_spec(value):
        value = superpixels.resolve(value, (x,), "segments")
    seg = torch.as_tensor(value)
    hw = tuple(x.shape[-2:])
    if seg.is_floating_point() or seg.dtype == torch.bool:
        raise InvalidArgumentError(
            f"segments must hold integer region ids, got {str(seg.dtype).removeprefix('torch.')}",
            argument="segments",
        )
    if seg.dim() == 4 and seg.shape[1] == 1:
        seg = seg[:, 0]
    if seg.dim() == 2:
        seg = seg.unsqueeze(0).expand(x.shape[0], *seg.shape)
    if seg.dim() != 3 or tuple(seg.shape[1:]) != hw or seg.shape[0] not in (1, x.shape[0]):
        raise InvalidArgumentError(
            f"segments must be an integer map [H, W] = {list(hw)} or one per example "
            f"[N, H, W]; got {list(seg.shape)}",
            argument="segments",
        )
    seg = seg.expand(x.shape[0], *hw)
    return [unpacked([s.cpu().numpy()]) for s in seg]


def unpacked(segs: list[np.ndarray]) -> list[np.ndarray]:
    """Each segmentation's regions as boolean masks, ids from its smallest to its largest."""
    return [seg == label for seg in segs for label in range(int(seg.min()), int(seg.max()) + 1)]


def default_masks(image: np.ndarray) -> list[np.ndarray]:
    """The reference's regions of one image (``[C, H, W]`` or ``[H, W]``): Felzenszwalb at
    each of ``SCALES`` on the image scaled to [-1, 1] and resized to 224 px, back at the
    image's size, each region dilated by a disk of 5 px."""
    segmentation = superpixels.skimage_segmentation()
    from skimage.morphology import disk
    from skimage.transform import resize

    hwc = np.moveaxis(image, 0, -1) if image.ndim == 3 else image[..., None]
    hwc = hwc.astype(np.float64)
    low, high = float(hwc.min()), float(hwc.max())
    scaled = (hwc - low) / ((high - low) or 1.0) * 2.0 - 1.0
    scaled = resize(
        scaled, RESIZE, order=3, mode="constant", preserve_range=True, anti_aliasing=True
    )
    segs = []
    for scale in SCALES:
        seg = segmentation.felzenszwalb(scaled, scale=scale, sigma=SIGMA, min_size=MIN_SIZE)
        seg = resize(
            seg, hwc.shape[:2], order=0, preserve_range=True, mode="constant",
            anti_aliasing=False,
        ).astype(int)  # fmt: skip
        segs.append(seg)
    return dilated(unpacked(segs), disk(DILATION))


def dilated(masks: list[np.ndarray], footprint: np.ndarray) -> list[np.ndarray]:
    """Each mask dilated by ``footprint`` (scikit-image's ``dilation`` of a boolean mask by a
    disk): a pixel is in where the footprint centred on it meets the mask. A disk is a stack
    of rows, so the dilation is, per row of it, the masks widened by that row's half-width and
    shifted by its offset, all masks at once (boolean shifts: 0.02 s for 268 masks of 224 px,
    against 1.3 s mask by mask). Nothing beyond the edges counts, which is what
    scikit-image's reflection gives for a disk (a reflected neighbour is nearer than the one
    it stands for)."""
    stack = np.stack(masks)
    h, w = stack.shape[-2:]
    cy, cx = footprint.shape[0] // 2, footprint.shape[1] // 2
    out = np.zeros_like(stack)
    widened = [stack]  # widened[k]: the masks widened by k pixels each side
    for row in range(footprint.shape[0]):
        cols = np.flatnonzero(footprint[row])
        if cols.size == 0:
            continue
        half = int(cols.max()) - cx  # a disk's row is symmetric about its centre
        while len(widened) <= half:
            k, last = len(widened), widened[-1].copy()
            last[..., k:] |= stack[..., : w - k]
            last[..., : w - k] |= stack[..., k:]
            widened.append(last)
        dy = row - cy  # the mask at y + dy reaches y
        src, dst = slice(max(0, dy), h + min(0, dy)), slice(max(0, -dy), h + min(0, -dy))
        out[:, dst] |= widened[half][:, src]
    return list(out)


def ranked(attr: np.ndarray, masks: list[np.ndarray], p: XRAIParams) -> tuple[Any, Any]:
    """XRAI over one image's attribution map ``[H, W]`` and candidate ``masks``: each pixel's
    gain (float64 ``[H, W]``) and the regions' ranks (int64 ``[H, W]``, 1 the best)."""
    if not masks:
        raise InvalidArgumentError("segments holds no region", argument="segments")
    stack = np.stack(masks).reshape(len(masks), -1)
    flat = attr.reshape(-1)
    if p.algorithm == "full":
        trace = _full(stack, flat, p.area_threshold, p.min_pixel_diff)
    else:
        trace = _fast(stack, flat, p.min_pixel_diff)
    out = np.full(flat.shape, -np.inf)
    for diff, gain in trace:
        out[diff] = gain
    uncomputed = out == -np.inf
    if uncomputed.any():  # the rest: its mean, so the map sums as the attributions do
        out[uncomputed] = flat[uncomputed].mean()
    order = [d for d, _ in sorted(trace, key=lambda t: -t[1])]
    if uncomputed.any():
        order.append(uncomputed)
    ranks = np.zeros(flat.shape, dtype=np.int64)
    for i, diff in enumerate(order):
        ranks[diff] = i + 1
    return out.reshape(attr.shape), ranks.reshape(attr.shape)


def _gain(diff: np.ndarray, flat: np.ndarray) -> float:
    return float(flat[diff].mean()) if diff.any() else -np.inf


def _full(
    stack: np.ndarray, flat: np.ndarray, area: float, min_diff: int
) -> list[tuple[np.ndarray, float]]:
    """Regions added greedily by the mean attribution of the pixels each would add."""
    current = np.zeros(flat.shape, dtype=bool)
    counts = stack.sum(axis=1).astype(np.int64)  # uncovered pixels of each region
    sums = np.array([flat[m].sum() for m in stack])  # their attribution
    scale = float(np.abs(flat).mean())  # what a running sum's rounding is relative to
    remaining = np.ones(len(stack), dtype=bool)
    trace: list[tuple[np.ndarray, float]] = []
    share = 0.0
    while share <= area:
        remaining &= counts >= min_diff  # too little to add: dropped for good
        if not remaining.any():
            break
        idx = np.flatnonzero(remaining)
        gains = sums[idx] / counts[idx]
        best = float(gains.max())
        near = idx[gains >= best - NEAR * max(abs(best), scale)]
        exact = [_gain(stack[j] & ~current, flat) for j in near]
        top = max(exact)
        pick = int(near[exact.index(top)])  # the first of the best, as the reference
        diff = stack[pick] & ~current
        trace.append((diff, top))
        current |= stack[pick]
        share = float(current.mean())
        remaining[pick] = False
        added = stack[:, diff]  # each region's share of the new pixels
        counts -= added.sum(axis=1)
        sums -= added.astype(np.float64) @ flat[diff]
    return trace


def _fast(stack: np.ndarray, flat: np.ndarray, min_diff: int) -> list[tuple[np.ndarray, float]]:
    """Regions ranked once by their own mean attribution, each adding the pixels not yet
    covered."""
    gains = [_gain(m, flat) for m in stack]
    order = sorted(range(len(stack)), key=lambda j: -gains[j])
    current = np.zeros(flat.shape, dtype=bool)
    trace: list[tuple[np.ndarray, float]] = []
    for j in order:
        diff = stack[j] & ~current
        if int(diff.sum()) < min_diff:
            continue
        trace.append((diff, _gain(diff, flat)))
        current |= stack[j]
    return trace
