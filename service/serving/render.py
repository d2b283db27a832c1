"""Pictures of one example's attributions: image heat maps and overlays, highlighted tokens, and
feature bar charts, as PNG or small HTML documents.

The semantics follow Captum's ``captum.attr.visualization`` (sign filters, the cumulative-sum
outlier scale, the default colormap per sign, channels summed for heat maps); the drawing is our
own, with numpy and Pillow only, so the same inputs always give the same bytes.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from functools import cache
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

from service.serving.marks import Marks, marked

OUTLIER_PERC = 2.0  # Captum's default: the top 2 % of the mass saturates
MIN_SIDE = 256  # small maps are upscaled (integer factor, NEAREST) to at least this
MAX_SIDE = 4096  # no picture larger than MAX_SIDE × MAX_SIDE
OVERLAY_ALPHA = 0.6  # heat map opacity at |v| = 1; zero attribution shows the plain image
PAD, GAP, BAR_H, LINE_H = 8, 4, 12, 14  # layout (px): margin, spacing, colour bar, text line
#: the least space between words (px): the default font's own (2 px at its 10 px) is no wider
#: than the gaps between its letters, so that "(class 0) · 3 channels summed" read as
#: "(class0)·3 channelssummed"
WORD_GAP = 4
WRAP_W = 800  # token pictures wrap lines at this width
CHART_W = 400  # tabular: width of the bar area

Floats = NDArray[np.float64]
RGB = tuple[int, int, int]

# Anchor colours, evenly spaced; sequential maps from ColorBrewer / matplotlib at 9 points.
COLORMAPS: dict[str, tuple[bool, str]] = {
    "blues": (False, "f7fbff deebf7 c6dbef 9dcae1 6aaed6 4191c6 2070b4 08509b 08306b"),
    "greens": (False, "f7fcf5 e5f5e0 c7e9c0 a0d99b 73c476 40aa5d 228a44 006c2c 00441b"),
    "reds": (False, "fff5f0 fee0d2 fcbba1 fc9272 fb694a ee3a2c ca181d a30f15 67000d"),
    "greys": (False, "ffffff f0f0f0 d9d9d9 bdbdbd 959595 727272 515151 242424 000000"),
    "viridis": (False, "440154 472d7b 3b528b 2c728e 21918c 28ae80 5ec962 addc30 fde725"),
    "inferno": (False, "000004 210c4a 57106e 8a226a bc3754 e45a31 f98e09 f9cb35 fcffa4"),
    # Diverging (-1..1): blue for negative, white at 0, red for positive (RdBu reversed).
    "rdbu": (True, "053061 2a71b2 6bacd1 c2ddec ffffff fbccb4 e48066 ba2832 67001f"),
    # Captum's default for sign "all": red for negative, white at 0, green for positive (not
    # attrserve's default: red-green is what colour-blind readers cannot tell apart, and red
    # meant positive in the explorer).
    "red_white_green": (True, "ff0000 ffffff 008000"),
}
#: one convention with the explorer: red is positive, blue negative (RdBu: colour-blind safe),
#: grey a magnitude without its sign (Captum's defaults are blues, greens, reds, and red-green)
DEFAULT_COLORMAP = {
    "absolute": "greys",
    "positive": "reds",
    "negative": "blues",
    "all": "rdbu",
}
SIGNS = tuple(DEFAULT_COLORMAP)


class RenderError(ValueError):
    """The attribution cannot be drawn as asked (a client error: the HTTP layer answers 422)."""


class RenderOptions(Protocol):
    """What :func:`draw` reads from the request's ``render`` spec (``RenderSpec``)."""

    @property
    def format(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def sign(self) -> str: ...
    @property
    def colormap(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Rendered:
    """A drawn picture: ``image/png`` or ``text/html`` bytes."""

    media_type: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Colormap:
    """An RGB lookup table of 257 entries (so that a diverging map's middle, 0, is an entry);
    diverging maps span -1..1, sequential ones 0..1."""

    name: str
    lut: NDArray[np.uint8]
    diverging: bool

    def colours(self, values: Floats, lo: float) -> NDArray[np.uint8]:
        """RGB for normalised ``values``, mapping ``lo``..1 onto the whole table."""
        index = np.rint((np.clip(values, lo, 1.0) - lo) / (1.0 - lo) * 256).astype(np.intp)
        return self.lut[index]


@dataclass(frozen=True, slots=True)
class _Look:
    """One drawing's resolved options."""

    format: str
    style: str  # the picture's style: heatmap or overlay (the request's render.kind)
    sign: str
    cmap: Colormap
    lo: float  # the score at the colormap's first entry: -1 (sign "all" or diverging) or 0
    title: str | None
    width: int | None = None  # the PNG's width in pixels (None: as drawn)

    def colours(self, norm: Floats) -> NDArray[np.uint8]:
        return self.cmap.colours(norm, self.lo)


@cache
def colormap(name: str) -> Colormap:
    """The named colormap (case-insensitive), built by linear interpolation of its anchors."""
    key = name.lower()
    if key not in COLORMAPS:
        raise RenderError(f"unknown colormap {name!r}; known: {', '.join(COLORMAPS)}")
    diverging, hexes = COLORMAPS[key]
    anchors = np.array([[int(h[i : i + 2], 16) for i in (0, 2, 4)] for h in hexes.split()], float)
    at, grid = np.linspace(0, 1, len(anchors)), np.linspace(0, 1, 257)
    lut = np.stack([np.interp(grid, at, anchors[:, c]) for c in range(3)], axis=1)
    return Colormap(key, np.rint(lut).astype(np.uint8), diverging)


def _signed(attr: Floats, sign: str) -> Floats:
    """Captum's sign filter; "negative" keeps the negative part as magnitudes."""
    if sign == "absolute":
        return np.abs(attr)
    if sign == "positive":
        return np.maximum(attr, 0.0)
    if sign == "negative":
        return np.maximum(-attr, 0.0)
    if sign == "all":
        return attr
    raise RenderError(f"unknown sign {sign!r}; known: {SIGNS}")


def outlier_scale(magnitudes: Floats) -> float:
    """Captum's ``_cumulative_sum_threshold``: the smallest magnitude at which the sorted
    magnitudes' running sum reaches (100 - OUTLIER_PERC) % of their total (not a plain
    percentile); 0 for an all-zero map."""
    ordered = np.sort(magnitudes, axis=None)
    cumulative = np.cumsum(ordered)
    if ordered.size == 0 or cumulative[-1] == 0:
        return 0.0
    # Same expression as Captum, so the threshold index matches it bit for bit.
    index = np.searchsorted(cumulative, cumulative[-1] * 0.01 * (100.0 - OUTLIER_PERC))
    return float(ordered[min(int(index), ordered.size - 1)])


def _scaled(attr: NDArray[np.floating] | Floats, sign: str) -> tuple[Floats, float]:
    values = _signed(np.asarray(attr, dtype=np.float64), sign)
    scale = outlier_scale(np.abs(values))
    if scale == 0:  # nothing to show: a neutral map, not a division by zero
        return np.zeros_like(values), 0.0
    return np.clip(values / scale, -1.0, 1.0), scale


def normalize(attr: NDArray[np.floating] | Floats, sign: str) -> Floats:
    """Attributions filtered by ``sign`` and divided by :func:`outlier_scale`: values in
    [-1, 1] for "all", else [0, 1] (as Captum's ``_normalize_attr``; zeros for a zero map)."""
    return _scaled(attr, sign)[0]


def draw(
    options: RenderOptions,
    attribution: NDArray[np.floating],
    inputs: NDArray[np.floating] | None = None,
    tokens: list[str] | None = None,
    feature_names: list[str] | None = None,
    title: str | None = None,
    marks: Marks | None = None,
) -> Rendered:
    """Draw one example's attribution (no batch dim). Tokens given → text; else by rank:
    [F] → tabular bar chart, [H, W] or [C, H, W] → image. Raises :class:`RenderError`."""
    attr = np.asarray(attribution, dtype=np.float64)
    if attr.size == 0:
        raise RenderError("cannot draw an empty attribution")
    if not np.isfinite(attr).all():
        raise RenderError("attribution has non-finite values (NaN or inf); cannot draw it")
    choices = {"format": ("png", "html"), "kind": ("heatmap", "overlay"), "sign": SIGNS}
    for field, known in choices.items():
        if getattr(options, field) not in known:
            raise RenderError(f"unknown {field} {getattr(options, field)!r}; known: {known}")
    sign = options.sign
    cmap = colormap(options.colormap or DEFAULT_COLORMAP[sign])
    lo = -1.0 if sign == "all" or cmap.diverging else 0.0
    width = getattr(options, "width", None)
    if title and attr.ndim == 3 and attr.shape[0] > 1 and tokens is None:
        title = f"{title} · {attr.shape[0]} channels summed"  # what the map shows
    look = _Look(options.format, options.kind, sign, cmap, lo, title, width)
    if options.kind == "overlay" and (tokens is not None or attr.ndim not in (2, 3)):
        raise RenderError("kind 'overlay' needs an image attribution ([C, H, W] or [H, W])")
    if tokens is not None:
        if attr.ndim != 1 or attr.shape[0] != len(tokens):
            raise RenderError(
                f"{len(tokens)} tokens need per-token scores of shape [{len(tokens)}]; "
                f"got {list(attr.shape)}"
            )
        return _text(attr, tokens, look)
    if attr.ndim == 1:
        names = feature_names or [f"f{i}" for i in range(attr.shape[0])]
        if len(names) != attr.shape[0]:
            raise RenderError(f"{len(names)} feature names for {attr.shape[0]} features")
        return _tabular(attr, names, look)
    if attr.ndim not in (2, 3):
        raise RenderError(
            f"cannot draw an attribution of shape {attr.shape}: expected [F] (tabular), "
            "[H, W] or [C, H, W] (image), or [L] with tokens (text)"
        )
    png = _encode(_image(attr, inputs, look, marks), look.width)
    if look.format == "png":
        return Rendered("image/png", png)
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return _document(title, f'<img alt="attribution heat map" src="{src}">')


# --- images -------------------------------------------------------------------------------


def _image(
    attr: Floats, inputs: NDArray[np.floating] | None, look: _Look, marks: Marks | None = None
) -> Image.Image:
    heat = attr.sum(axis=0) if attr.ndim == 3 else attr  # Captum sums channels for heat maps
    h, w = heat.shape
    factor = max(1, -(-MIN_SIDE // max(h, w)))
    _check_size(w * factor + 2 * PAD, h * factor + _frame_height(look.title))
    norm, scale = _scaled(heat, look.sign)
    rgb = look.colours(norm).astype(np.float64)
    if look.style == "overlay":
        alpha = OVERLAY_ALPHA * np.abs(norm)[..., None]
        rgb = _as_rgb(inputs, (h, w)) * (1.0 - alpha) + rgb * alpha
    picture = Image.fromarray(np.rint(rgb).astype(np.uint8))
    picture = picture.resize((w * factor, h * factor), Image.Resampling.NEAREST)
    return _framed(marked(picture, marks, factor), look, scale)


def image(
    pixels: NDArray[np.floating], title: str | None = None, width: int | None = None
) -> Rendered:
    """An input image itself ([C, H, W] with 1 or 3 channels, or [H, W]; within [0, 1] as it
    is, else min-max rescaled), framed with its title, as PNG (``width`` pixels wide when
    given)."""
    arr = np.asarray(pixels, dtype=np.float64)
    if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[0] not in (1, 3)):
        raise RenderError(f"an image is [1|3, H, W] or [H, W]; got {list(arr.shape)}")
    h, w = arr.shape[-2:]
    factor = max(1, -(-MIN_SIDE // max(h, w)))
    _check_size(w * factor + 2 * PAD, h * factor + _frame_height(title))
    picture = Image.fromarray(np.rint(_as_rgb(arr, (h, w))).astype(np.uint8))
    picture = picture.resize((w * factor, h * factor), Image.Resampling.NEAREST)
    look = _Look("png", "heatmap", "all", colormap(DEFAULT_COLORMAP["all"]), -1.0, title, width)
    return Rendered("image/png", _encode(_framed(picture, look, None), width))


def _as_rgb(inputs: NDArray[np.floating] | None, hw: tuple[int, int]) -> Floats:
    """The input image as [H, W, 3] in 0..255: kept (×255) if within [0, 1], else min-max
    rescaled."""
    image = None if inputs is None else np.asarray(inputs, dtype=np.float64)
    if image is not None and image.shape == hw:
        image = image[None]
    if image is None or image.shape not in ((1, *hw), (3, *hw)):
        shape = None if inputs is None else list(np.asarray(inputs).shape)
        raise RenderError(
            f"kind 'overlay' needs the input image, [1|3, {hw[0]}, {hw[1]}] "
            f"or {list(hw)}; got {shape}"
        )
    if not np.isfinite(image).all():
        raise RenderError("input image has non-finite values (NaN or inf); cannot overlay it")
    low, high = float(image.min()), float(image.max())
    if low < 0.0 or high > 1.0:
        image = (image - low) / ((high - low) or 1.0)
    return np.repeat(image, 3 // image.shape[0], axis=0).transpose(1, 2, 0) * 255.0


# --- tokens -------------------------------------------------------------------------------


def _text(attr: Floats, tokens: list[str], look: _Look) -> Rendered:
    norm, scale = _scaled(attr, look.sign)
    colours = [_rgb(row) for row in look.colours(norm)]
    if look.format == "html":
        spans = " ".join(
            f'<span style="background:{_css(rgb)};color:{_css(_ink(rgb))}" '
            f'title="{score:.3g}">{html.escape(token, quote=True)}</span>'
            for token, score, rgb in zip(tokens, attr.tolist(), colours, strict=True)
        )
        note = f"full colour at |score| ≥ {scale:.3g} (Captum's outlier scale)"
        return _document(look.title, f"<p class=tokens>{spans}</p>", note)
    font, boxes, x, y = _font(), [], 0, 0
    for token in tokens:
        text = _drawable(token, font)
        width = int(np.ceil(_length(text, font))) + 2 * GAP
        if x > 0 and x + width > WRAP_W:
            x, y = 0, y + LINE_H + GAP
            if y > MAX_SIDE:  # too tall already: _check_size below refuses it
                break
        boxes.append((x, y, width, text))
        x += width + GAP
    width = max(MIN_SIDE, *(bx + bw for bx, _, bw, _ in boxes))  # at least a readable colour bar
    _check_size(width + 2 * PAD, y + LINE_H + _frame_height(look.title))
    body = Image.new("RGB", (width, y + LINE_H), "white")
    pen = ImageDraw.Draw(body)
    for (bx, by, bw, text), rgb in zip(boxes, colours, strict=True):
        pen.rectangle((bx, by, bx + bw - 1, by + LINE_H - 1), fill=rgb)
        _write(pen, (bx + GAP, by + 1), text, _ink(rgb), font)
    return Rendered("image/png", _encode(_framed(body, look, scale), look.width))


# --- tabular ------------------------------------------------------------------------------


def _tabular(attr: Floats, names: list[str], look: _Look) -> Rendered:
    """Bars of the raw scores after the sign filter (lengths are exact, not outlier-clipped);
    "negative" keeps negative scores on the left of the zero axis. Each bar is labelled with its
    feature's score, sign and all, whichever scores the filter draws."""
    values = np.minimum(attr, 0.0) if look.sign == "negative" else _signed(attr, look.sign)
    ends = (1.0, -1.0 if look.lo < 0 else 1.0)  # sequential 0..1 maps: one colour for both
    pos, neg = (_rgb(look.colours(np.array([v]))[0]) for v in ends)
    peak = float(np.abs(values).max()) or 1.0
    if look.format == "html":
        rows = "".join(
            f"<tr><td>{html.escape(name, quote=True)}</td><td class=num>{number(score)}</td>"
            f'<td class=neg><div style="width:{max(-v, 0) / peak * 100:.1f}%;'
            f'background:{_css(neg)}"></div></td><td class=pos><div style="width:'
            f'{max(v, 0) / peak * 100:.1f}%;background:{_css(pos)}"></div></td></tr>'
            for name, score, v in zip(names, attr.tolist(), values.tolist(), strict=True)
        )
        return _document(look.title, f"<table>{rows}</table>")
    font = _font()
    labels = [_drawable(name, font) for name in names]
    texts = [number(score) for score in attr.tolist()]
    name_w = int(max(_length(s, font) for s in labels)) + GAP
    value_w = int(max(_length(s, font) for s in texts)) + GAP
    row = LINE_H + GAP
    size = (name_w + CHART_W + value_w + 2 * GAP, len(names) * row)
    _check_size(size[0] + 2 * PAD, size[1] + 2 * PAD + (LINE_H + GAP if look.title else 0))
    body = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(body)
    low, high = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
    span = (high - low) or 1.0
    axis = name_w + GAP + round(CHART_W * -low / span)
    for i, (label, text, v) in enumerate(zip(labels, texts, values.tolist(), strict=True)):
        top, end = i * row, axis + round(CHART_W * v / span)
        _write(pen, (0, top + 1), label, "black", font)
        if end != axis:
            pen.rectangle(
                (min(axis, end), top + 1, max(axis, end), top + LINE_H - 2),
                fill=pos if v > 0 else neg,
            )
        _write(pen, (name_w + CHART_W + 2 * GAP, top + 1), text, "black", font)
    pen.line((axis, 0, axis, size[1] - 1), fill="black")
    return Rendered("image/png", _encode(_framed(body, look, None), look.width))


# --- shared -------------------------------------------------------------------------------


Font = ImageFont.ImageFont | ImageFont.FreeTypeFont
Ink = RGB | str


def _font() -> Font:
    """Pillow's default font; loaded per picture (~0.1 ms) so no FreeType face is shared by the
    threads that draw at once."""
    return ImageFont.load_default()


def _drawable(text: str, font: Font) -> str:
    """Text the font can draw: the bitmap fallback font (no FreeType) knows Latin-1 only."""
    text = " ".join(text.splitlines())  # one line per box
    if isinstance(font, ImageFont.FreeTypeFont):
        return text
    return text.encode("latin-1", "replace").decode("latin-1")


def _words(text: str, font: Font) -> tuple[list[tuple[float, str]], float]:
    """Each word of one line of ``text`` with where it starts, and the line's length: words
    :data:`WORD_GAP` apart, or the font's own space where that is wider."""
    gap = max(float(font.getlength(" ")), float(WORD_GAP))
    placed, x = [], 0.0
    for word in text.split(" "):
        if word:
            placed.append((x, word))
            x += float(font.getlength(word))
        x += gap
    return placed, x - gap


def _length(text: str, font: Font) -> float:
    """How long :func:`_write` draws ``text``."""
    return _words(text, font)[1]


def _write(
    pen: ImageDraw.ImageDraw, at: tuple[float, float], text: str, fill: Ink, font: Font
) -> None:
    """``text`` drawn one word at a time, so that its spaces show (:data:`WORD_GAP`)."""
    for x, word in _words(text, font)[0]:
        pen.text((at[0] + x, at[1]), word, fill=fill, font=font)


def _ink(rgb: RGB) -> RGB:
    """Black or white text, whichever reads on the background ``rgb``."""
    return (0, 0, 0) if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] >= 128 else (255, 255, 255)


def _rgb(row: NDArray[np.uint8]) -> RGB:
    return int(row[0]), int(row[1]), int(row[2])


def _css(rgb: RGB) -> str:
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def _frame_height(title: str | None) -> int:
    """Height the frame adds around a body that has a colour bar."""
    return 2 * PAD + (LINE_H + GAP if title else 0) + GAP + BAR_H + LINE_H


def _check_size(width: int, height: int) -> None:
    if width > MAX_SIDE or height > MAX_SIDE:
        raise RenderError(
            f"the picture would be {width}×{height} pixels, over the {MAX_SIDE}×{MAX_SIDE} limit"
        )


def _framed(body: Image.Image, look: _Look, scale: float | None) -> Image.Image:
    """``body`` on a white canvas with a margin, the title above and, given the ``scale`` (score
    of a full colour), a colour bar below labelled with the scores at its ends."""
    font, top = _font(), PAD + (LINE_H + GAP if look.title else 0)
    text = _drawable(look.title or "", font)
    width = min(MAX_SIDE, max(body.width, int(np.ceil(_length(text, font)))) + 2 * PAD)
    height = top + body.height + PAD + (0 if scale is None else GAP + BAR_H + LINE_H)
    canvas = Image.new("RGB", (width, height), "white")
    canvas.paste(body, (PAD, top))
    pen = ImageDraw.Draw(canvas)
    _write(pen, (PAD, PAD), text, "black", font)
    if scale is not None:
        y = top + body.height + GAP
        ramp = look.colours(np.linspace(look.lo, 1.0, body.width))
        canvas.paste(Image.fromarray(np.repeat(ramp[None], BAR_H, axis=0)), (PAD, y))
        right = number(scale)
        _write(pen, (PAD, y + BAR_H), number(look.lo * scale), "black", font)
        _write(pen, (PAD + body.width - _length(right, font), y + BAR_H), right, "black", font)
    return canvas


def number(v: float) -> str:
    """A score for a label: 3 significant digits, and never "-0"."""
    text = f"{v:.3g}"
    return "0" if float(text) == 0 else text


def _encode(picture: Image.Image, width: int | None = None) -> bytes:
    """PNG bytes, scaled to ``width`` pixels wide (the height in proportion) when given."""
    if width is not None and width != picture.width:
        height = max(1, min(MAX_SIDE, round(picture.height * width / picture.width)))
        picture = picture.resize((width, height), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")  # no metadata chunks, so the bytes are deterministic
    return buffer.getvalue()


def _document(title: str | None, body: str, note: str | None = None) -> Rendered:
    heading = html.escape(title or "attribution", quote=True)
    page = (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{heading}</title><style>body{{font-family:sans-serif}}"
        "span{padding:0 2px;white-space:pre}td.num{text-align:right}"
        "td.neg,td.pos{width:200px}td.neg div{margin-left:auto}td.pos{border-left:1px solid #000}"
        "td div{height:0.9em}</style></head>"
        f"<body><p><b>{heading}</b></p>{body}"
        + (f"<p><small>{html.escape(note)}</small></p>" if note else "")
        + "</body></html>\n"
    )
    return Rendered("text/html", page.encode("utf-8"))
