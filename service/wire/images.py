"""Images sent encoded, ``{"image": "<base64 PNG, JPEG or WebP>"}`` per example, for the
models that take them (Hugging Face image classifiers, ``ModelSpec.images``): decoded on the
server and made into the model's ``pixel_values`` by its own image processor
(``model_registry.hf_image``); each error names the example and what is wrong with it."""

from __future__ import annotations

from typing import Any

import numpy as np

from model_registry import hf_image
from model_registry.image_header import declared_size
from model_registry.spec import ModelSpec
from service.core.errors import WHERE, ImageTooLarge, InvalidRequest, LimitExceeded, Loc


def is_image(item: Any) -> bool:
    """An encoded image: ``{"image": "<base64>"}`` (or KServe's ``{"image": {"b64": ...}}``),
    not a tensor keyed by an input named ``image``."""
    if not isinstance(item, dict) or "image" not in item:
        return False
    value = item["image"]
    return isinstance(value, (str, bytes)) or (isinstance(value, dict) and set(value) == {"b64"})


def sent(raw: Any, spec: ModelSpec) -> bool:
    """Whether ``inputs`` are encoded images (then checked one by one): on a model that takes
    them, a list of objects with an ``image``; on any model, a list of encoded images."""
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], dict):
        return False
    return is_image(raw[0]) or (spec.images is not None and "image" in raw[0])


def _image_bytes(item: dict[str, Any], loc: Loc) -> bytes:
    value = item["image"]
    if isinstance(value, bytes):  # OIP BYTES in binary: the file itself
        return value
    if isinstance(value, dict) and set(value) == {"b64"}:
        value = value["b64"]
    if len(item) != 1 or not isinstance(value, str):
        raise InvalidRequest(
            f'{WHERE} must be {{"image": "<base64 PNG, JPEG or WebP>"}}', loc=loc[:-1]
        )
    try:
        return hf_image.payload(value)
    except ValueError as exc:
        raise InvalidRequest(f"{WHERE} {exc}", loc=loc) from None


def decode(
    raw: list[Any], spec: ModelSpec, max_elements: int, max_batch: int, max_image_pixels: int
) -> tuple[np.ndarray, tuple[bytes, ...]]:
    """Encoded images as the ``pixel_values`` of the model's image processor, and each
    image's file; 413 where their headers declare more than ``max_image_pixels`` in all."""
    loc: Loc = ("body", "inputs")
    if spec.images is None:
        raise InvalidRequest(
            f"model {spec.id!r} takes no encoded images; send its inputs as tensors", loc=loc
        )
    if len(raw) > max_batch:
        raise LimitExceeded(
            f"inputs hold {len(raw)} images; the limit is {max_batch} per request", loc=loc
        )
    processor = hf_image.images(spec.images)
    per_image = int(np.prod(processor.shape))
    if per_image * len(raw) > max_elements:
        raise LimitExceeded(
            f"{len(raw)} images make {per_image * len(raw)} pixel values; the limit is "
            f"{max_elements} per request",
            loc=loc,
        )
    # every image's header first: a request over the pixel limit decodes none of its images
    files: list[bytes] = []
    left = max_image_pixels
    for k, item in enumerate(raw):
        where: Loc = (*loc, k, "image")
        if not isinstance(item, dict) or "image" not in item:
            raise InvalidRequest(
                f'{WHERE} must be {{"image": "<base64>"}} as the first example is', loc=where[:-1]
            )
        data = _image_bytes(item, where)
        size = declared_size(data)
        if size is not None:
            _bound(size, left, max_image_pixels, where)
            left -= size[0] * size[1]
        files.append(data)
    # then one image decoded at a time (its pixels counted again: a header only Pillow reads)
    values, left = [], max_image_pixels
    for k, data in enumerate(files):
        where = (*loc, k, "image")
        try:
            picture = hf_image.decode(data, left)
        except hf_image.TooManyPixels as exc:  # a header only Pillow reads, or its own bound
            raise ImageTooLarge(f"{WHERE} {exc}", loc=where) from None
        except ValueError as exc:
            raise InvalidRequest(f"{WHERE} {exc}", loc=where) from None
        left -= picture.width * picture.height
        try:
            values.append(processor([picture])[0])
        except Exception as exc:  # an image its processor cannot take (an odd mode or size)
            raise InvalidRequest(
                f"{WHERE}: the model's image processor cannot take it: {exc}", loc=where
            ) from None
    return np.stack(values), tuple(files)


def _bound(size: tuple[int, int], left: int, limit: int, where: Loc) -> None:
    """413 where an image of ``size`` is over the ``left`` of a request's ``limit``."""
    if size[0] * size[1] <= left:
        return
    rest = "" if left == limit else f", {max(left, 0):,} left for this one"
    raise ImageTooLarge(
        f"{WHERE} is {size[0]}×{size[1]} pixels; a request's images may hold {limit:,} pixels "
        f"in all (ATTRSERVE_MAX_IMAGE_PIXELS){rest}",
        loc=where,
    )
