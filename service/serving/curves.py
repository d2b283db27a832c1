"""A picture of one feature's dependence curves: each row's ICE curve in light grey (at most
``MAX_ROWS`` of them) and the partial dependence, their average, in a thick line, over the
feature's grid; the axes' ends labelled with their values."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WIDTH, HEIGHT = 480, 320
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 36
MAX_ROWS = 100
AVERAGE_RGB = (178, 24, 43)  # the explorer's positive red
ROW_RGB = (190, 190, 190)


def _label(v: float) -> str:
    return f"{v:.4g}"


def draw(
    grid: list[float],
    average: list[float] | None,
    individual: list[list[float]] | None,
    title: str,
) -> bytes:
    """The curves as a PNG (``WIDTH`` x ``HEIGHT``)."""
    xs = np.asarray(grid, dtype=np.float64)
    lines = [np.asarray(r, dtype=np.float64) for r in (individual or [])[:MAX_ROWS]]
    mean = None if average is None else np.asarray(average, dtype=np.float64)
    every = np.concatenate([*lines, *([] if mean is None else [mean])])
    lo, hi = float(every.min()), float(every.max())
    if hi == lo:  # a flat curve: a band around it
        lo, hi = lo - 0.5, hi + 0.5
    x0, x1 = float(xs.min()), float(xs.max())
    span_x = (x1 - x0) or 1.0

    def at(x: np.ndarray, y: np.ndarray) -> list[tuple[float, float]]:
        px = LEFT + (x - x0) / span_x * (WIDTH - LEFT - RIGHT)
        py = HEIGHT - BOTTOM - (y - lo) / (hi - lo) * (HEIGHT - TOP - BOTTOM)
        return list(zip(px.tolist(), py.tolist(), strict=True))

    picture = Image.new("RGB", (WIDTH, HEIGHT), "white")
    pen = ImageDraw.Draw(picture)
    font = ImageFont.load_default()
    pen.rectangle([LEFT, TOP, WIDTH - RIGHT, HEIGHT - BOTTOM], outline=(120, 120, 120))
    for row in lines:
        pen.line(at(xs, row), fill=ROW_RGB, width=1)
    if mean is not None:
        pen.line(at(xs, mean), fill=AVERAGE_RGB, width=3)
    pen.text((4, 6), title[:80], fill=(0, 0, 0), font=font)
    pen.text((4, TOP), _label(hi), fill=(0, 0, 0), font=font)
    pen.text((4, HEIGHT - BOTTOM - 10), _label(lo), fill=(0, 0, 0), font=font)
    pen.text((LEFT, HEIGHT - BOTTOM + 6), _label(x0), fill=(0, 0, 0), font=font)
    right = _label(x1)
    pen.text(
        (WIDTH - RIGHT - 6 * len(right), HEIGHT - BOTTOM + 6), right, fill=(0, 0, 0), font=font
    )
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return buffer.getvalue()
