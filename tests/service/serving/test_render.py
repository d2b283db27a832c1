"""Pictures of attributions: sizes, where the colour goes, signs, overlays, escaping, bar charts,
errors, determinism, and the normalisation against Captum's."""

from __future__ import annotations

import base64
import io
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from typing import Any

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from service.serving import render
from service.wire.attributions import RenderSpec

PAD, FRAME = render.PAD, render.GAP + render.BAR_H + render.LINE_H  # layout of a framed map
rng = np.random.default_rng(0)


def draw(attribution: Any, **kwargs: Any) -> render.Rendered:
    """Drawn at its own size (``width`` None: the layout these tests measure), unless a
    ``width`` is given."""
    spec = {k: kwargs.pop(k) for k in ("format", "kind", "sign", "colormap") if k in kwargs}
    width = kwargs.pop("width", None)
    options = RenderSpec(**spec).model_copy(update={"width": width})
    return render.draw(options, np.asarray(attribution), **kwargs)


def pixels(out: render.Rendered) -> np.ndarray:
    assert out.media_type == "image/png"
    with Image.open(io.BytesIO(out.data)) as image:
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB")).astype(int)


def heat(out: render.Rendered, h: int, w: int) -> np.ndarray:
    """The map region of an image picture drawn without a title."""
    return pixels(out)[PAD : PAD + h, PAD : PAD + w]


def lut(name: str, value: float, lo: float = 0.0) -> np.ndarray:
    return render.colormap(name).colours(np.array([value]), lo)[0].astype(int)


@pytest.fixture
def written(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every string handed to Pillow to draw, in order (the drawing itself goes on)."""
    texts: list[str] = []
    text = ImageDraw.ImageDraw.text

    def spy(pen: ImageDraw.ImageDraw, xy: Any, words: str, *args: Any, **kwargs: Any) -> None:
        texts.append(words)
        text(pen, xy, words, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", spy)
    return texts


# --- images -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "map_size"),
    [
        ((3, 32, 32), (256, 256)),
        ((32, 32), (256, 256)),
        ((20, 33), (264, 160)),
        ((1, 2, 300), (300, 2)),
        ((7, 7), (259, 259)),
    ],
)
def test_image_is_upscaled_by_an_integer_factor_keeping_the_aspect(
    shape: tuple[int, ...], map_size: tuple[int, int]
) -> None:
    image = pixels(draw(rng.normal(size=shape)))
    w, h = map_size
    assert image.shape == (h + 2 * PAD + FRAME, w + 2 * PAD, 3)


def test_a_title_widens_nothing_but_adds_a_line() -> None:
    plain = pixels(draw(rng.normal(size=(3, 32, 32))))
    titled = pixels(draw(rng.normal(size=(3, 32, 32)), title="saliency · target 3"))
    assert titled.shape[1] == plain.shape[1] and titled.shape[0] > plain.shape[0]


def test_heatmap_colour_is_where_the_attribution_mass_is() -> None:
    attr = np.zeros((3, 32, 32))
    attr[:, 4:12, 20:28] = 1.0  # top-right quadrant
    attr += rng.normal(scale=1e-3, size=attr.shape)
    block = heat(draw(attr, sign="absolute"), 256, 256)
    inside, outside = block[40:90, 170:220], block[150:250, 10:120]
    assert np.abs(inside - lut("greys", 1.0)).max() <= 3  # saturated
    assert np.abs(outside - lut("greys", 0.0)).max() <= 3  # near the light end of the map
    assert inside.mean(axis=(0, 1)).sum() < outside.mean(axis=(0, 1)).sum() - 300


def test_by_default_the_sign_shows_red_positive_blue_negative() -> None:
    """Signed by default, in the explorer's colours (CONTRACT 6.4's sign "all"); a magnitude
    without its sign, grey, only when asked for."""
    attr = np.ones((16, 16))
    attr[:, 8:] = -1.0
    assert RenderSpec().sign == "all"
    block = heat(draw(attr), 256, 256)
    assert (block[:, :128] == lut("rdbu", 1.0, lo=-1.0)).all()  # dark red
    assert (block[:, 128:] == lut("rdbu", -1.0, lo=-1.0)).all()  # dark blue
    grey = heat(draw(attr, sign="absolute"), 256, 256)
    assert (grey == lut("greys", 1.0)).all()  # both sides alike: the sign is not shown


def test_title_keeps_its_spaces() -> None:
    """Each space of a title is a gap wider than any between two letters of a word (the default
    font's own space, 2 px, is not)."""
    title = "image-cnn · saliency · cat (class 0)"
    image = pixels(draw(rng.normal(size=(3, 8, 8)), title=title))
    band = image[PAD : PAD + render.LINE_H, PAD:] < 200  # ink: the title's line
    ink = np.flatnonzero(band.any(axis=(0, 2)))
    gaps = np.diff(ink) - 1  # blank columns between inked ones
    title += " · 3 channels summed"  # what the map shows, added by the drawing
    assert (gaps >= render.WORD_GAP).sum() == title.count(" ")
    for word in title.split(" "):  # no word alone has a gap that wide
        alone = pixels(draw(np.zeros((8, 8)), title=word))[PAD : PAD + render.LINE_H, PAD:]
        inked = np.flatnonzero((alone < 200).any(axis=(0, 2)))
        assert (np.diff(inked) - 1 < render.WORD_GAP).all(), word


def test_heatmap_sums_channels_as_captum() -> None:
    x = rng.normal(size=(16, 16))
    cancelling = draw(np.stack([x, -x, np.zeros_like(x)]))
    assert cancelling.data == draw(np.zeros((3, 16, 16))).data


def test_all_zero_map_is_neutral() -> None:
    block = heat(draw(np.zeros((8, 8)), sign="all"), 256, 256)
    assert (block == 255).all()  # white: the middle of the diverging map


def test_positive_shows_nothing_for_an_all_negative_map() -> None:
    attr = -rng.uniform(0.1, 1.0, size=(3, 16, 16))
    block = heat(draw(attr, sign="positive"), 256, 256)
    assert (block == lut("reds", 0.0)).all()
    shown = heat(draw(attr, sign="negative"), 256, 256)
    assert (shown != lut("blues", 0.0)).any(axis=-1).mean() > 0.9


@pytest.mark.parametrize(
    ("colormap", "plus", "minus"), [(None, 0, 2), ("rdbu", 0, 2), ("red_white_green", 1, 0)]
)
def test_sign_all_uses_different_hues_for_plus_and_minus(
    colormap: str | None, plus: int, minus: int
) -> None:
    attr = np.ones((16, 16))
    attr[:, 8:] = -1.0
    block = heat(draw(attr, sign="all", colormap=colormap), 256, 256)
    left, right = block[:, :128].mean(axis=(0, 1)), block[:, 128:].mean(axis=(0, 1))
    # by default red positive and blue negative, as the explorer draws; Captum's map on request
    assert left.argmax() == plus and right.argmax() == minus


@pytest.mark.parametrize(
    "image",
    [rng.uniform(size=(3, 16, 16)), rng.normal(size=(3, 16, 16)) * 50, rng.uniform(size=(16, 16))],
)
def test_overlay_with_zero_attribution_shows_the_plain_image(image: np.ndarray) -> None:
    attr = np.zeros((3, 16, 16))
    attr[:, :4, :4] = 1.0
    block = heat(draw(attr, kind="overlay", inputs=image), 256, 256)
    if image.min() < 0 or image.max() > 1:
        image = (image - image.min()) / (image.max() - image.min())
    plain = np.rint(np.broadcast_to(image, (3, 16, 16)).transpose(1, 2, 0) * 255).astype(int)
    expected = plain.repeat(16, axis=0).repeat(16, axis=1)
    assert (block[64:, 64:] == expected[64:, 64:]).all()
    assert (block[:64, :64] != expected[:64, :64]).any()  # the attributed corner is tinted


def test_image_html_embeds_the_png() -> None:
    attr = rng.normal(size=(3, 8, 8))
    page = draw(attr, format="html", title="<i>").data.decode()
    assert page.startswith("<!DOCTYPE html>") and 'charset="utf-8"' in page
    assert "<i>" not in page and "&lt;i&gt;" in page
    src = page.split('src="data:image/png;base64,')[1].split('"')[0]
    assert base64.b64decode(src) == draw(attr, title="<i>").data


# --- tokens -------------------------------------------------------------------------------


class Spans(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.spans: list[dict[str, str | None]] = []
        self.texts: list[str] = []
        self.inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        assert tag not in ("script", "img")
        if tag == "span":
            self.spans.append(dict(attrs))
            self.texts.append("")
            self.inside = True

    def handle_endtag(self, tag: str) -> None:
        self.inside = self.inside and tag != "span"

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.texts[-1] += data


def test_text_html_escapes_tokens_one_span_each() -> None:
    tokens = ["<script>alert(1)</script>", '"', "a&b", "'", "##ing", "naïve"]
    scores = np.array([0.5, -1.0, 0.0, 2.0, 1e-4, -3.0])
    page = draw(scores, tokens=tokens, format="html", sign="all").data.decode()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert page.count("<span") == len(tokens)
    parser = Spans()
    parser.feed(page)
    assert parser.texts == tokens
    assert [span["title"] for span in parser.spans] == [f"{s:.3g}" for s in scores]
    backgrounds = [span["style"] for span in parser.spans]
    assert len({backgrounds[1], backgrounds[3], backgrounds[2]}) == 3  # -, +, 0 differ


def test_text_png_wraps_long_texts() -> None:
    short = pixels(draw(rng.normal(size=3), tokens=["a", "good", "film"]))
    tokens = ["tokenization"] * 200
    long = pixels(draw(rng.normal(size=200), tokens=tokens, title="ig"))
    assert long.shape[0] > short.shape[0] + 15 * render.LINE_H
    assert long.shape[1] <= render.WRAP_W + 2 * PAD


# --- tabular ------------------------------------------------------------------------------


def bar_runs(image: np.ndarray, colour: Any) -> list[tuple[int, int, int]]:
    """(row, first x, last x) of each table row whose centre line holds ``colour``."""
    row_h = render.LINE_H + render.GAP
    runs = []
    for i in range((image.shape[0] - 2 * PAD) // row_h):
        xs = np.flatnonzero((image[PAD + i * row_h + render.LINE_H // 2] == colour).all(axis=-1))
        if xs.size:
            assert xs[-1] - xs[0] + 1 == xs.size  # one contiguous bar
            runs.append((i, int(xs[0]), int(xs[-1])))
    return runs


def test_tabular_bar_chart_one_bar_per_feature_on_its_side_of_the_axis() -> None:
    scores = [2.0, -1.0, 0.5, -0.25]
    image = pixels(draw(scores, sign="all", feature_names=["age", "income", "x", "y"]))
    # red positive, blue negative: the explorer's convention (rdbu's ends)
    green = bar_runs(image, tuple(lut("rdbu", 1.0, lo=-1.0)))
    red = bar_runs(image, tuple(lut("rdbu", -1.0, lo=-1.0)))
    assert [r[0] for r in green] == [0, 2] and [r[0] for r in red] == [1, 3]
    axis = green[0][1] - 1
    assert (image[PAD:-PAD, axis] == 0).all()  # the zero axis, black
    assert all(first == axis + 1 for _, first, _ in green)
    assert all(last == axis - 1 for *_, last in red)
    length = {i: max(last - axis, axis - first) for i, first, last in green + red}
    np.testing.assert_allclose(
        [length[i] for i in range(4)], np.abs(scores) * length[0] / 2, atol=1
    )


def test_tabular_sign_filters_bars() -> None:
    positive = bar_runs(pixels(draw([2.0, -1.0], sign="positive")), lut("reds", 1.0))
    assert [row for row, *_ in positive] == [0]
    absolute = bar_runs(pixels(draw([2.0, -1.0], sign="absolute")), lut("greys", 1.0))
    assert [row for row, *_ in absolute] == [0, 1]
    assert absolute[0][1] == absolute[1][1]  # both to the right of the axis


@pytest.mark.parametrize("sign", render.SIGNS)
def test_tabular_bars_are_labelled_with_their_signed_scores(sign: str, written: list[str]) -> None:
    """Whichever bars the sign filter draws, each is labelled with its feature's score."""
    scores = [0.5, -0.0639, 0.2, 0.0]
    draw(scores, sign=sign, feature_names=["age", "income", "x", "y"])
    # row by row: the feature's name, then its bar's label
    assert [w for w in written if w] == ["age", "0.5", "income", "-0.0639", "x", "0.2", "y", "0"]
    page = draw(scores, sign=sign, format="html", feature_names=["a", "b", "c", "d"]).data
    assert b"<td class=num>-0.0639</td>" in page and b"<td class=num>0.5</td>" in page


def test_tabular_html_one_row_per_feature_escaped() -> None:
    page = draw([1.0, -2.0, 0.0], format="html", feature_names=["<i>", "b", "c"]).data.decode()
    assert page.count("<tr>") == 3 and "&lt;i&gt;" in page and "<i>" not in page


# --- errors, determinism, colormaps, normalisation ----------------------------------------


@pytest.mark.parametrize(
    ("attribution", "kwargs", "message"),
    [
        (np.float64(1.0), {}, "shape"),
        (np.zeros((1, 3, 4, 4)), {}, "shape"),
        (np.zeros((0,)), {}, "empty"),
        (np.zeros((3, 8, 8)), {"kind": "overlay"}, "overlay"),
        (np.zeros((3, 8, 8)), {"kind": "overlay", "inputs": np.zeros((3, 8, 9))}, "overlay"),
        (np.zeros((3, 8, 8)), {"kind": "overlay", "inputs": np.zeros((4, 8, 8))}, "overlay"),
        (np.zeros(4), {"kind": "overlay", "inputs": np.zeros(4)}, "overlay"),
        (np.zeros((8, 8)), {"colormap": "jet"}, "viridis"),
        (np.zeros(3), {"tokens": ["a", "b"]}, "tokens"),
        (np.zeros((3, 2)), {"tokens": ["a", "b", "c"]}, "tokens"),
        (np.zeros(3), {"feature_names": ["a"]}, "feature names"),
        (np.array([[0.0, np.nan]]), {}, "non-finite"),
        (np.array([1.0, np.inf]), {}, "non-finite"),
        (np.zeros((8, 8)), {"kind": "overlay", "inputs": np.full((8, 8), np.nan)}, "non-finite"),
        (np.zeros((5000, 10)), {}, "4096"),
        (np.zeros(1000), {}, "4096"),
        (np.zeros(10_000), {"tokens": ["word"] * 10_000}, "4096"),
    ],
)
def test_render_errors(attribution: np.ndarray, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(render.RenderError, match=message):
        draw(attribution, **kwargs)
    assert issubclass(render.RenderError, ValueError)


def test_options_outside_the_schema_are_refused() -> None:
    class Options:
        format, kind, sign, colormap = "png", "heatmap", "absolute_value", None

    with pytest.raises(render.RenderError, match="sign"):
        render.draw(Options(), np.zeros((4, 4)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {
            "attribution": rng.normal(size=(3, 16, 16)),
            "inputs": rng.uniform(size=(3, 16, 16)),
            "kind": "overlay",
            "title": "t",
        },
        {"attribution": rng.normal(size=5), "tokens": list("abcde")},
        {"attribution": rng.normal(size=5), "format": "html"},
    ],
)
def test_output_is_deterministic(kwargs: dict[str, Any]) -> None:
    first = draw(**dict(kwargs))
    draw(rng.normal(size=(8, 8)), sign="all")
    assert draw(**dict(kwargs)).data == first.data
    assert b"tIME" not in first.data and b"tEXt" not in first.data


def test_threads_drawing_at_once_give_the_serial_bytes() -> None:
    jobs: list[dict[str, Any]] = [
        {"attribution": rng.normal(size=(3, 16, 16)), "sign": "all"},
        {"attribution": rng.normal(size=40), "tokens": [f"w{i}" for i in range(40)]},
        {"attribution": rng.normal(size=12)},
    ] * 4
    serial = [draw(**dict(job)).data for job in jobs]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda job: draw(**dict(job)).data, jobs)) == serial


def test_text_for_the_bitmap_font_is_latin_1_on_one_line() -> None:
    bitmap = ImageFont.load_default_imagefont()
    assert render._drawable("日本 é\nb", bitmap) == "?? é b"


def test_default_colormap_by_sign_and_names_case_insensitive() -> None:
    attr = rng.normal(size=(8, 8))
    for sign, name in render.DEFAULT_COLORMAP.items():
        assert draw(attr, sign=sign).data == draw(attr, sign=sign, colormap=name.upper()).data
    assert render.colormap("rdbu").diverging and not render.colormap("viridis").diverging
    assert (lut("rdbu", 0.0, lo=-1.0) == 255).all()  # white at 0
    assert lut("rdbu", -1.0, lo=-1.0).argmax() == 2 and lut("rdbu", 1.0, lo=-1.0).argmax() == 0


@pytest.mark.parametrize("name", list(render.COLORMAPS))
def test_colormaps_approximate_matplotlib(name: str) -> None:
    mpl = pytest.importorskip("matplotlib")
    from matplotlib.colors import LinearSegmentedColormap

    reference = {"rdbu": "RdBu_r", "viridis": "viridis", "inferno": "inferno"}
    if name == "red_white_green":
        cmap = LinearSegmentedColormap.from_list("RdWhGn", ["red", "white", "green"])
    else:
        cmap = mpl.colormaps[reference.get(name, name.capitalize())]
    want = np.rint(cmap(np.linspace(0, 1, 257))[:, :3] * 255)
    error = np.abs(render.colormap(name).lut.astype(int) - want)
    assert error.max() <= (2 if name in ("blues", "greens", "reds", "greys") else 20)
    assert error.mean() <= 4


CAPTUM_SIGN = {
    "absolute": "absolute_value",
    "positive": "positive",
    "negative": "negative",
    "all": "all",
}


@pytest.mark.parametrize("sign", list(CAPTUM_SIGN))
@pytest.mark.parametrize("heavy_tailed", [False, True])
def test_normalize_matches_captum(sign: str, heavy_tailed: bool) -> None:
    from captum.attr._utils.visualization import _normalize_attr

    attr = rng.standard_cauchy(size=(24, 20)) if heavy_tailed else rng.normal(size=(24, 20))
    want = _normalize_attr(attr, CAPTUM_SIGN[sign], outlier_perc=2)
    got = render.normalize(attr, sign)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert got.min() >= (-1 if sign == "all" else 0) and got.max() <= 1
    assert (np.abs(got) == 1).any()  # the outliers saturate


@pytest.mark.parametrize("sign", list(CAPTUM_SIGN))
def test_heatmap_colours_are_captums_channel_summed_normalisation(sign: str) -> None:
    from captum.attr._utils.visualization import _normalize_attr

    attr = rng.normal(size=(3, 16, 16))  # ours channels-first; Captum's images channels-last
    want = _normalize_attr(attr.transpose(1, 2, 0).sum(axis=2), CAPTUM_SIGN[sign], 2)
    name = render.DEFAULT_COLORMAP[sign]
    colours = render.colormap(name).colours(want, -1.0 if sign == "all" else 0.0)
    assert (heat(draw(attr, sign=sign), 256, 256)[::16, ::16] == colours).all()


def test_normalize_zero_map_and_float32() -> None:
    assert (render.normalize(np.zeros((4, 4)), "all") == 0).all()
    assert (render.normalize(-np.ones((4, 4)), "positive") == 0).all()
    x = rng.normal(size=(6, 6)).astype(np.float32)
    np.testing.assert_allclose(render.normalize(x, "all"), render.normalize(x.astype(float), "all"))


@pytest.mark.parametrize("width", [480, 64, 1000])
def test_a_png_is_as_wide_as_asked_and_480_by_default(width: int) -> None:
    for attribution, kw in (
        (rng.normal(size=(3, 32, 32)), {}),
        (rng.normal(size=8), {}),
        (rng.normal(size=5), {"tokens": ["a", "fine", "film", "it", "is"]}),
    ):
        assert pixels(draw(attribution, width=width, **kw)).shape[1] == width
    assert RenderSpec().width == 480


def test_no_label_reads_minus_zero() -> None:
    assert render.number(-0.0) == "0" and render.number(-1e-9) == "-1e-09"
    assert render.number(-0.00001) == "-1e-05" and render.number(-0.0004) == "-0.0004"
    assert render.number(-1e-30 * 0) == "0"
