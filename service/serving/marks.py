"""What pictures outline over an image map: a segmentation target's region, a detection
target's box, and the segments an answer credits (superpixels, XRAI's regions)
(``render.draw``'s ``marks``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw


@dataclass(frozen=True)
class Marks:
    """What is outlined over an image map, in its pixels: a region (H×W, true inside: a
    segmentation target's) and boxes (x1, y1, x2, y2: a detection target's)."""

    region: NDArray[np.bool_] | None = None
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    #: segment ids (H×W): their borders are drawn
    segments: NDArray[np.int64] | None = None


#: the outlines' colour: visible over every colormap's ends and a photo
MARK_RGB = (255, 0, 255)
#: segments' borders: thinner, and yellow, apart from a target's outline
SEGMENT_RGB = (255, 220, 0)


def borders(labels: NDArray[np.int64]) -> NDArray[np.bool_]:
    """The pixels of a label map beside a pixel of another label (right, left, below or
    above): a line two pixels wide, which survives a picture's downscale."""
    edge = np.zeros(labels.shape, dtype=bool)
    right = labels[:, :-1] != labels[:, 1:]
    below = labels[:-1, :] != labels[1:, :]
    edge[:, :-1] |= right
    edge[:, 1:] |= right
    edge[:-1, :] |= below
    edge[1:, :] |= below
    return edge


def _eroded(inside: NDArray[np.bool_]) -> NDArray[np.bool_]:
    """The pixels of ``inside`` whose four neighbours are inside too (the border is out)."""
    out = np.zeros_like(inside)
    out[1:-1, 1:-1] = (
        inside[1:-1, 1:-1] & inside[:-2, 1:-1] & inside[2:, 1:-1] & inside[1:-1, :-2]
        & inside[1:-1, 2:]
    )  # fmt: skip
    return out


def marked(picture: Image.Image, marks: Marks | None, factor: int) -> Image.Image:
    """``picture`` (the map ``factor`` times its size) with the region's edge and the boxes
    drawn over it."""
    if marks is None:
        return picture
    shape = (picture.height // factor, picture.width // factor)
    if marks.segments is not None and marks.segments.shape == shape:
        labels = np.repeat(np.repeat(marks.segments, factor, axis=0), factor, axis=1)
        pixels = np.asarray(picture).copy()
        pixels[borders(labels)] = SEGMENT_RGB
        picture = Image.fromarray(pixels)
    if marks.region is not None and marks.region.shape == (picture.height // factor,
                                                           picture.width // factor):  # fmt: skip
        inside = np.asarray(marks.region, dtype=bool)
        big = np.repeat(np.repeat(inside, factor, axis=0), factor, axis=1)
        edge = big & ~_eroded(_eroded(big))  # two pixels wide: it survives a downscale
        pixels = np.asarray(picture).copy()
        pixels[edge] = MARK_RGB
        picture = Image.fromarray(pixels)
    pen = ImageDraw.Draw(picture)
    for x1, y1, x2, y2 in marks.boxes:
        pen.rectangle([x1 * factor, y1 * factor, x2 * factor - 1, y2 * factor - 1],
                      outline=MARK_RGB, width=2)  # fmt: skip
    return picture
