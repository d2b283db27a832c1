"""A Hugging Face image classifier (``AutoModelForImageClassification``) served as a tensor
model of its image processor's ``pixel_values``.

Images arrive as encoded files (PNG, JPEG or WebP, base64 on the wire), are decoded on the
server (EXIF orientation applied, bounded in pixels before any is decoded) and become
``pixel_values`` through the directory's own image processor, so they are resized, cropped,
rescaled and normalised exactly as the model saw its training images; attributions are on
those ``pixel_values``.

Pictures draw over the original image, at its size: ``Images.box`` says where the
``pixel_values`` lie on it. It is found by running the processor on ramps whose values are
their own coordinates, so it holds for every processor that resizes, crops and normalises each
channel, whatever its class's own arithmetic (a ``crop_pct``, a shortest edge, a crop size).
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import nn

from model_registry.hf_config import config
from model_registry.image_header import declared_size

AUTO_CLASS = "AutoModelForImageClassification"
#: segmentation models: logits per class and pixel
SEGMENTATION_AUTO_CLASS = "AutoModelForSemanticSegmentation"
#: detectors: DETR-style logits and boxes per query (``model_registry.detection``)
DETECTION_AUTO_CLASS = "AutoModelForObjectDetection"
#: the encodings an image may arrive in (PIL tries only these decoders; ``image_header``
#: reads the size of each)
FORMATS = ("PNG", "JPEG", "WEBP")


class ImageClassifier(nn.Module):
    """``model(pixel_values=...).logits``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values).logits


class Segmenter(nn.Module):
    """``model(pixel_values=...).logits`` upsampled (bilinearly) to the pixel_values' size,
    as the processor's ``post_process_semantic_segmentation`` does: one class score per
    pixel of the model's input (SegFormer's logits are a quarter of it)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        logits = self.model(pixel_values=pixel_values).logits
        if logits.shape[-2:] == pixel_values.shape[-2:]:
            return logits
        return nn.functional.interpolate(
            logits, size=pixel_values.shape[-2:], mode="bilinear", align_corners=False
        )


def payload(text: str) -> bytes:
    """The bytes of a base64 image (a ``data:image/...;base64,`` prefix allowed); ValueError
    saying what is wrong."""
    if text.startswith("data:"):
        head, _, text = text.partition(",")
        if not head.endswith(";base64"):
            raise ValueError("a data: URL must be base64 (data:image/png;base64,...)")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not base64 text") from None


class TooManyPixels(ValueError):
    """An image that declares more pixels than it may have: ``size`` (None where only
    Pillow read it), over ``max_pixels`` (the caller's bound, or Pillow's own where that is
    lower)."""

    def __init__(self, size: tuple[int, int] | None, max_pixels: int) -> None:
        shown = "more" if size is None else f"{size[0]}×{size[1]}"
        super().__init__(f"declares {shown} pixels, over {max_pixels:,}")
        self.size = size
        self.max_pixels = max_pixels


def decode(data: bytes, max_pixels: int | None = None) -> Image.Image:
    """An encoded image, decoded (EXIF orientation applied); ValueError saying why it cannot
    be, TooManyPixels where its header declares more than ``max_pixels`` (checked before a
    pixel is decoded; None: Pillow's own bound only)."""
    declared = declared_size(data)
    if declared is not None and max_pixels is not None:
        _bound(declared, max_pixels)
    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # over Pillow's own bound, where that is lower
        raise TooManyPixels(declared, 2 * int(Image.MAX_IMAGE_PIXELS or 0)) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise ValueError(f"is not an image in any of {', '.join(FORMATS)}") from None
    if max_pixels is not None:  # a header only Pillow reads
        _bound(image.size, max_pixels)
    try:
        image.load()
        return ImageOps.exif_transpose(image)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"is a truncated or corrupt {image.format} image ({e})") from None


def _bound(size: tuple[int, int], max_pixels: int) -> None:
    if size[0] * size[1] > max_pixels:
        raise TooManyPixels(size, max_pixels)


class Images:
    """The directory's image processor: decoded images as ``pixel_values`` of one shape, and
    where those lie on an image of a given size."""

    def __init__(self, directory: str) -> None:
        import transformers  # the optional extra, and a heavy import: only when used

        channels = int(config(Path(directory)).get("num_channels") or 3)
        if channels not in (1, 3):
            raise ValueError(f"its config has num_channels {channels}; images have 1 or 3")
        self.mode = "RGB" if channels == 3 else "L"
        try:
            self.processor = transformers.AutoImageProcessor.from_pretrained(
                directory, local_files_only=True
            )
        except Exception as e:  # OSError without preprocessor_config.json, ValueError ...
            raise ValueError(
                "the directory has no image processor that loads (preprocessor_config.json; "
                f"image_processor.save_pretrained(DIR)): {' '.join(str(e).split())}"
            ) from None
        shapes = {self([Image.new(self.mode, size)]).shape[1:] for size in ((61, 47), (97, 131))}
        if len(shapes) != 1:
            raise ValueError(
                "its image processor gives pixel_values whose size follows the image's "
                f"({sorted(shapes)}); serve one that resizes to one size"
            )
        self.shape: tuple[int, ...] = shapes.pop()
        self._boxes: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        self._lock = threading.Lock()

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        """``pixel_values`` (float32, [N, C, H, W]) of ``images``."""
        ready = [im if im.mode == self.mode else im.convert(self.mode) for im in images]
        out = self.processor(images=ready, return_tensors="np")["pixel_values"]
        return np.ascontiguousarray(out, dtype=np.float32)

    def box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """Where ``pixel_values`` lie on a ``width``×``height`` image: (left, top, right,
        bottom) in its pixels, edges included."""
        with self._lock:
            if (width, height) not in self._boxes:
                self._boxes[(width, height)] = self._probe(width, height)
            return self._boxes[(width, height)]

    def _probe(self, width: int, height: int) -> tuple[float, float, float, float]:
        ramp_x = np.broadcast_to(np.linspace(0, 255, width), (height, width))
        ramp_y = np.broadcast_to(np.linspace(0, 255, height)[:, None], (height, width))
        planes = [np.zeros((height, width)), np.full((height, width), 255.0), ramp_x, ramp_y]
        probes = [Image.fromarray(np.rint(p).astype(np.uint8)).convert(self.mode) for p in planes]
        low, high, xs, ys = self(probes)[:, 0].astype(np.float64)
        span = high - low
        if not np.all(np.abs(span) > 1e-6):  # not an affine map of the pixel values: all of it
            return 0.0, 0.0, float(width), float(height)
        # each output pixel's source position, 0..1 across the image, averaged along the
        # other axis and fitted by a line without the outer pixels (resampling clamps there)
        u = ((xs - low) / span).mean(axis=0)
        v = ((ys - low) / span).mean(axis=1)
        left, right = _edges(u, width)
        top, bottom = _edges(v, height)
        return left, top, right, bottom


def _edges(position: np.ndarray, size: int) -> tuple[float, float]:
    """The first and last output pixel's outer edges in the original's pixels, from each
    output pixel's source position (0..1 between the first and the last pixel centre)."""
    n = position.shape[0]
    inner = np.arange(1, n - 1) if n >= 4 else np.arange(n)
    if inner.size < 2:
        return 0.0, float(size)
    slope, offset = np.polyfit(inner, position[inner], 1)
    first = (offset - 0.5 * slope) * (size - 1) + 0.5
    last = (offset + (n - 0.5) * slope) * (size - 1) + 0.5
    return max(0.0, float(first)), min(float(size), float(last))


@functools.lru_cache(maxsize=64)
def images(directory: str) -> Images:
    """The directory's ``Images`` (loaded once per process); ValueError saying why not."""
    return Images(directory)
