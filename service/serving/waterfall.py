"""Waterfall pictures (``render.kind: "waterfall"``), as shap draws one explanation: from the
base value (the output at the baselines) at the bottom, each feature's (or token's)
attribution added as a bar, largest |value| at the top, up to the output. At most
``MAX_ROWS`` rows: the rest is summed into one "N other features" row."""

from __future__ import annotations

import html

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw

from service.serving.render import (
    CHART_W,
    GAP,
    LINE_H,
    Rendered,
    RenderError,
    RenderOptions,
    _check_size,
    _css,
    _document,
    _drawable,
    _encode,
    _font,
    _framed,
    _length,
    _Look,
    _rgb,
    _write,
    colormap,
    number,
)

#: rows drawn, the "other features" row included (shap's max_display)
MAX_ROWS = 10


def rows(attr: NDArray[np.floating], names: list[str]) -> list[tuple[str, float]]:
    """(label, value) top to bottom: the largest |value| first, the rest summed last."""
    order = np.argsort(-np.abs(attr), kind="stable")
    if len(order) <= MAX_ROWS:
        return [(names[i], float(attr[i])) for i in order]
    shown, rest = order[: MAX_ROWS - 1], order[MAX_ROWS - 1 :]
    others = (f"{len(rest)} other features", float(attr[rest].sum()))
    return [*((names[i], float(attr[i])) for i in shown), others]


def draw(
    options: RenderOptions,
    attribution: NDArray[np.floating],
    names: list[str],
    base_value: float,
    output: float,
    title: str | None = None,
    width: int | None = None,
) -> Rendered:
    """One example's waterfall: ``attribution`` [F] over ``names`` from ``base_value`` to
    ``output`` (PNG, or an HTML table). Raises :class:`RenderError`."""
    attr = np.asarray(attribution, dtype=np.float64)
    if attr.ndim != 1 or attr.size == 0 or len(names) != attr.shape[0]:
        raise RenderError(
            "kind 'waterfall' draws one value per feature or token; got shape "
            f"{list(attr.shape)} for {len(names)} names"
        )
    if not np.isfinite(attr).all() or not np.isfinite([base_value, output]).all():
        raise RenderError("attribution has non-finite values (NaN or inf); cannot draw it")
    cmap = colormap(options.colormap or "rdbu")
    look = _Look(options.format, "waterfall", "all", cmap, -1.0, title, width)
    pos, neg = (_rgb(look.colours(np.array([v]))[0]) for v in (1.0, -1.0))
    top_down = rows(attr, names)
    starts, ends, total = [], [], base_value
    for _, v in reversed(top_down):  # the bars build up from the base value at the bottom
        starts.append(total)
        total += v
        ends.append(total)
    starts.reverse()
    ends.reverse()
    if look.format == "html":
        body = "".join(
            f"<tr><td>{html.escape(name, quote=True)}</td><td class=num>{'+' if v > 0 else ''}"
            f"{number(v)}</td><td class=num>{number(s)} → {number(e)}</td>"
            f'<td><div style="width:1em;background:{_css(pos if v > 0 else neg)}"></div></td>'
            "</tr>"
            for (name, v), s, e in zip(top_down, starts, ends, strict=True)
        )
        note = f"f(x) = {number(output)}; base value E[f(X)] = {number(base_value)}"
        return _document(title, f"<table>{body}</table>", note)
    font = _font()
    labels = [_drawable(name, font) for name, _ in top_down]
    name_w = int(max(_length(s, font) for s in labels)) + GAP
    row_h = LINE_H + GAP
    height = (len(top_down) + 2) * row_h
    size = (name_w + CHART_W + 2 * GAP + 80, height)
    _check_size(size[0] + 40, size[1] + 80)
    picture = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(picture)
    low = min(base_value, output, *starts, *ends)
    high = max(base_value, output, *starts, *ends)
    span = (high - low) or 1.0
    x0 = name_w + GAP

    def at(v: float) -> int:
        return x0 + round(CHART_W * (v - low) / span)

    top_line = f"f(x) = {number(output)}"
    _write(pen, (at(output) - _length(top_line, font) / 2, 1), top_line, "black", font)
    for i, ((label, v), s, e) in enumerate(zip(top_down, starts, ends, strict=True)):
        y = (i + 1) * row_h
        _write(pen, (0, y + 1), label, "black", font)
        left, right = sorted((at(s), at(e)))
        box = (left, y + 1, max(right, left + 1), y + LINE_H - 2)
        pen.rectangle(box, fill=pos if v > 0 else neg)
        text = ("+" if v > 0 else "") + number(v)
        _write(pen, (max(right, left + 1) + GAP, y + 1), text, "black", font)
    bottom = f"E[f(X)] = {number(base_value)}"
    y = (len(top_down) + 1) * row_h
    _write(pen, (at(base_value) - _length(bottom, font) / 2, y + 1), bottom, "black", font)
    for v in (base_value, output):  # dotted guides at the base value and the output
        for yy in range(row_h, y, 4):
            pen.point((at(v), yy), fill="grey")
    return Rendered("image/png", _encode(_framed(picture, look, None), look.width))
