"""Superpixels: feature groups an image's own content draws, for perturbation methods.

``{"superpixels": {"algorithm": ..., ...}}`` given as a ``feature_mask`` segments each image
with scikit-image (``slic``, ``felzenszwalb``, ``quickshift``, its parameters passed through)
or cuts it into a ``grid`` of ``size: [h, w]`` cells, as Captum's tutorials and SageMaker
Clarify build their image masks. Each image is taken channels last and min-max scaled to
[0, 1] on its own (a model's normalised ``pixel_values`` included), so one set of parameters
means the same on every input; its segments are numbered 0..K-1 in scan order. An image that
occurs twice is segmented once (``segment_batch``).

scikit-image is the ``regions`` extra: the grid needs nothing, the other algorithms say how to
install it when it is missing. XRAI's default segments (``methods.gradient.xrai``) come from
``segment`` too.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from methods.errors import InvalidArgumentError, InvalidTypeError

ALGORITHMS = ("slic", "felzenszwalb", "quickshift", "grid")
#: parameters of scikit-image's functions the server sets itself (the image and its layout)
#: or that change what the function returns
_OWN = frozenset({"image", "channel_axis", "mask", "return_tree", "start_label"})
#: the grid's cell when ``size`` is not given
GRID_SIZE = (16, 16)
#: where a spec is given (``feature_mask.superpixels`` in a request)
WHERE = "feature_mask.superpixels"


class MissingDependency(InvalidArgumentError):
    """An optional package a request needs is not installed on this server."""


def skimage_segmentation() -> Any:
    """scikit-image's segmentation module, or a ``MissingDependency`` saying how to get it."""
    try:
        from skimage import segmentation
    except ImportError:
        raise MissingDependency(
            "superpixels by slic, felzenszwalb or quickshift need scikit-image, which this "
            "server does not have (pip install 'attrserve[regions]'); the grid needs nothing",
            argument=f"{WHERE}.algorithm",
        ) from None
    return segmentation


def is_spec(value: Any) -> bool:
    """Whether a ``feature_mask`` is a superpixels spec (``{"superpixels": {...}}``)."""
    return isinstance(value, Mapping) and set(value) == {"superpixels"}


def parse(value: Any, where: str = WHERE) -> dict[str, Any]:
    """A superpixels spec checked: its algorithm known, each parameter one the algorithm
    takes (scikit-image's signature, less the ones set here), of a JSON scalar type."""
    spec = value["superpixels"] if is_spec(value) else value
    if not isinstance(spec, Mapping):
        raise InvalidTypeError(
            f"{where} must be an object with an algorithm ({', '.join(ALGORITHMS)}) and its "
            f"parameters, got {type(spec).__name__}",
            argument=where,
        )
    algorithm = spec.get("algorithm")
    if algorithm not in ALGORITHMS:
        raise InvalidArgumentError(
            f"{where}.algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}",
            argument=f"{where}.algorithm",
        )
    params = {k: v for k, v in spec.items() if k != "algorithm"}
    allowed = parameters(algorithm)
    for name, v in params.items():
        if name not in allowed:
            raise InvalidArgumentError(
                f"{algorithm} takes no parameter {name!r}; its parameters are "
                f"{', '.join(allowed) or 'none'}",
                argument=f"{where}.{name}",
            )
        if not _plain(v):
            raise InvalidTypeError(
                f"{where}.{name} must be a number, a boolean, a string or a list of numbers",
                argument=f"{where}.{name}",
            )
    if algorithm == "grid":
        size = params.get("size", GRID_SIZE)
        if (
            not isinstance(size, (list, tuple))
            or len(size) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size)
        ):
            raise InvalidArgumentError(
                f"{where}.size must be [h, w], two positive integers (a cell's height and "
                f"width in pixels), got {size!r}",
                argument=f"{where}.size",
            )
        params["size"] = [int(s) for s in size]
    return {"algorithm": algorithm, **params}


def parameters(algorithm: str) -> list[str]:
    """The parameters ``algorithm`` takes from a request."""
    if algorithm == "grid":
        return ["size"]
    fn = getattr(skimage_segmentation(), algorithm)
    return [n for n in inspect.signature(fn).parameters if n not in _OWN]


def _plain(v: Any) -> bool:
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (list, tuple)) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in v
    )


def channels_last(image: np.ndarray) -> np.ndarray:
    """One image ``[C, H, W]`` (or ``[H, W]``) as scikit-image takes it: ``[H, W, C]`` (a
    single channel as ``[H, W]``), min-max scaled to [0, 1] (a constant image: zeros)."""
    arr = np.asarray(image, dtype=np.float64)
    if arr.ndim == 3:
        arr = arr[0] if arr.shape[0] == 1 else np.moveaxis(arr, 0, -1)
    elif arr.ndim != 2:
        raise InvalidArgumentError(
            f"superpixels segment images, [C, H, W] or [H, W] per example; got an example of "
            f"shape {list(arr.shape)}",
            argument="feature_mask",
        )
    if not np.isfinite(arr).all():
        raise InvalidArgumentError(
            "an image holds NaN or infinite values: it cannot be segmented",
            argument="inputs",
        )
    low, high = float(arr.min()), float(arr.max())
    return (arr - low) / (high - low) if high > low else np.zeros_like(arr)


def segment(image: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """The segments of one image ``[C, H, W]`` (or ``[H, W]``) by a parsed ``spec``: int64
    ``[H, W]``, numbered 0..K-1 in the order they are first met scanning rows."""
    algorithm = spec["algorithm"]
    params = {k: v for k, v in spec.items() if k != "algorithm"}
    hw = np.asarray(image).shape[-2:]
    if algorithm == "grid":
        h, w = params["size"]
        rows = np.arange(hw[0]) // h
        cols = np.arange(hw[1]) // w
        labels = rows[:, None] * math.ceil(hw[1] / w) + cols[None, :]
        return labels.astype(np.int64)
    scaled = channels_last(image)
    fn = getattr(skimage_segmentation(), algorithm)
    if scaled.ndim == 2 and algorithm == "quickshift":  # colour only: grey as three channels
        scaled = np.repeat(scaled[..., None], 3, axis=-1)
        params.setdefault("convert2lab", False)
    kwargs = {"channel_axis": None if scaled.ndim == 2 else -1, **params}
    try:
        labels = fn(scaled, **kwargs)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(
            f"scikit-image's {algorithm} refused these parameters: {exc}", argument=WHERE
        ) from None
    return renumbered(np.asarray(labels))


def renumbered(labels: np.ndarray) -> np.ndarray:
    """Segment labels as 0..K-1, in the order each is first met scanning rows."""
    flat = labels.reshape(-1)
    _, first, inverse = np.unique(flat, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # label rank by first occurrence
    return order[inverse].reshape(labels.shape).astype(np.int64)


def segment_batch(images: np.ndarray, spec: Mapping[str, Any]) -> np.ndarray:
    """Segments of each image of a batch ``[N, C, H, W]`` (or ``[N, H, W]``): int64
    ``[N, H, W]``; an image met twice is segmented once."""
    arr = np.ascontiguousarray(images)
    seen: dict[bytes, np.ndarray] = {}
    out = []
    for image in arr:
        key = hashlib.blake2b(image.tobytes(), digest_size=16).digest()
        if key not in seen:
            seen[key] = segment(image, spec)
        out.append(seen[key])
    return np.stack(out) if out else np.zeros((0, *arr.shape[-2:]), dtype=np.int64)


def is_image_shape(shape: tuple[int | None, ...]) -> bool:
    """Whether per-example ``shape`` (no batch dim) is an image's: ``[1|3, H, W]``."""
    return len(shape) == 3 and shape[0] in (1, 3, None)


def masks_of(arrays: list[np.ndarray], spec: Mapping[str, Any]) -> list[np.ndarray]:
    """The feature masks of image batches (each ``[N, C, H, W]`` or ``[N, H, W]``) by a parsed
    ``spec``: ``[N, 1, H, W]`` or ``[N, H, W]`` int64 each, ids running on across inputs."""
    masks, start = [], 0
    for a in arrays:
        labels = segment_batch(a, spec) + start
        start = int(labels.max()) + 1 if labels.size else start
        masks.append(labels[:, None] if a.ndim == 4 else labels)
    return masks


def resolve(value: Any, xs: tuple[Any, ...], argument: str = "feature_mask") -> Any:
    """A superpixels spec made the feature mask of image inputs (``masks_of``, on the
    inputs' device): one tensor for one input, else a tuple."""
    import torch

    spec = parse(value, f"{argument}.superpixels")
    for i, x in enumerate(xs):
        if x.dim() not in (3, 4) or not x.is_floating_point():
            raise InvalidArgumentError(
                f"superpixels segment image inputs, floating [N, C, H, W] or [N, H, W]; input "
                f"{i} is {str(x.dtype).removeprefix('torch.')} {list(x.shape)}: give an integer "
                f"{argument} instead",
                argument=argument,
            )
    found = masks_of([x.detach().cpu().numpy() for x in xs], spec)
    masks = [torch.from_numpy(m).to(x.device) for m, x in zip(found, xs, strict=True)]
    return masks[0] if len(masks) == 1 else tuple(masks)


def resolved(names: frozenset[str], p: Any, xs: tuple[Any, ...]) -> tuple[Any, Any]:
    """Params ``p`` with each superpixels spec among its mask params ``names`` made a mask
    (``resolve``), and the mask drawn (None where none was)."""
    drawn = None
    for name in sorted(names):
        value = getattr(p, name, None)
        if is_spec(value):
            drawn = resolve(value, xs, name)
            p = p.model_copy(update={name: drawn})
    return p, drawn
