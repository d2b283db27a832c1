"""What hidden image regions become, as shap's ``Image`` masker fills them: ``"blur(kx,ky)"``
(a box blur of the image, OpenCV's ``cv2.blur``: a kx-wide, ky-tall window centred at
``(kx // 2, ky // 2)``, the border reflected without repeating the edge), a number, or
``"inpaint_telea"`` / ``"inpaint_ns"`` (OpenCV's inpainting of the hidden pixels from the
shown ones, per coalition; needs ``opencv-python-headless``, the ``images`` extra).

Images are ``(N, C, H, W)`` here and channels-last ``(H, W, C)`` in shap; a box blur acts on
each channel alone, so the layout does not change it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from methods.errors import InvalidArgumentError

_BLUR = re.compile(r"^blur\(\s*(\d+)\s*,\s*(\d+)\s*\)$")
INPAINT = ("inpaint_telea", "inpaint_ns")
#: what an image masker may be, for errors and the schema's description
FORMS = '"blur(kx,ky)" (kx, ky >= 1), "inpaint_telea", "inpaint_ns" or a number'


@dataclass(frozen=True)
class ImageMasker:
    """A parsed ``image_masker``: exactly one of ``blur`` (kx, ky), ``value``, ``inpaint``."""

    blur: tuple[int, int] | None = None
    value: float | None = None
    inpaint: str | None = None


def parse(spec: object) -> ImageMasker:
    if isinstance(spec, bool):
        spec = None  # a bool is not a fill value
    if isinstance(spec, (int, float)):
        if not np.isfinite(spec):
            raise InvalidArgumentError(
                f"partition: image_masker {spec} is not a finite number", argument="image_masker"
            )
        return ImageMasker(value=float(spec))
    if isinstance(spec, str):
        found = _BLUR.match(spec.strip())
        if found is not None and int(found[1]) >= 1 and int(found[2]) >= 1:
            return ImageMasker(blur=(int(found[1]), int(found[2])))
        if spec in INPAINT:
            _cv2()
            return ImageMasker(inpaint=spec)
    raise InvalidArgumentError(
        f"partition: image_masker {spec!r} is not one of {FORMS}", argument="image_masker"
    )


def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise InvalidArgumentError(
            "partition: inpainting image maskers need OpenCV (pip install "
            "'attrserve[images]', or opencv-python-headless); use \"blur(kx,ky)\" or a number",
            argument="image_masker",
        ) from None
    return cv2


def fill(masker: ImageMasker, x: Tensor) -> Tensor:
    """The image every hidden pixel takes (blur or value), for ``x`` (N, C, H, W)."""
    if masker.value is not None:
        return torch.full_like(x, masker.value)
    if masker.blur is None:
        raise ValueError("an inpainting masker fills per coalition (inpainted)")
    kx, ky = masker.blur
    return _box(_box(x, ky, dim=2), kx, dim=3)


def _box(x: Tensor, k: int, dim: int) -> Tensor:
    """The mean over a window of ``k`` along ``dim``, from ``k // 2`` before to the rest after,
    indices outside reflected about the edge (OpenCV's BORDER_REFLECT_101)."""
    n = int(x.shape[dim])
    if k == 1:
        return x
    pos = torch.arange(n, device=x.device).unsqueeze(1) + torch.arange(k, device=x.device) - k // 2
    if n == 1:
        idx = torch.zeros_like(pos)
    else:
        period = 2 * (n - 1)
        idx = pos.remainder(period)
        idx = torch.where(idx >= n, period - idx, idx)
    gathered = x.index_select(dim, idx.reshape(-1))
    shape = list(x.shape)
    shape[dim : dim + 1] = [n, k]
    return gathered.reshape(shape).sum(dim + 1) / k


def inpainted(masker: ImageMasker, x: Tensor, shown: Tensor) -> Tensor:
    """Each image of ``x`` (N, C, H, W) with its hidden pixels inpainted as shap does: a pixel
    is hidden where any of its channels is (``shown``: bool, x's shape), filled by OpenCV
    (radius 3) from the image cast to uint8 (images of 0..255, as shap's); with every pixel
    hidden, the image's mean colour. Shown pixels keep their values (shap returns OpenCV's
    uint8 copy of them: the same for integer-valued images)."""
    cv2 = _cv2()
    flag = cv2.INPAINT_TELEA if masker.inpaint == "inpaint_telea" else cv2.INPAINT_NS
    out = torch.empty_like(x)
    images = x.detach().permute(0, 2, 3, 1).cpu().numpy()  # channels last, as OpenCV takes
    hidden = (~shown).permute(0, 2, 3, 1).cpu().numpy().max(3).astype(np.uint8)
    for i in range(images.shape[0]):
        img = images[i]
        if hidden[i].all():
            done = np.broadcast_to(img.mean((0, 1)), img.shape).astype(img.dtype)
        else:
            done = cv2.inpaint(img.astype(np.uint8), hidden[i], 3, flag).astype(img.dtype)
            done = done.reshape(img.shape)
        out[i] = torch.from_numpy(np.ascontiguousarray(done)).to(out).permute(2, 0, 1)
    pixel_hidden = (~shown).any(1, keepdim=True)
    return torch.where(pixel_hidden, out, x)
