"""Pictures through the service: renders in the JSON response, the picture itself
with an Accept header, and Grad-CAM upsampled to the input."""

from __future__ import annotations

import base64
import io
from html.parser import HTMLParser
from typing import Any

import httpx
import numpy as np
import torch
from PIL import Image

from tests.service.conftest import Server


def image_batch(n: int) -> np.ndarray:
    from model_registry.builtin import image

    x, _ = image.make_data(n, torch.Generator().manual_seed(3))
    return x.numpy()


def post(server: Server, model: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60, **kw)


def png(data: bytes) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    im.load()
    assert im.format == "PNG"
    return im


def test_renders_in_the_json_response(server: Server) -> None:
    x = image_batch(3)
    r = post(
        server,
        "image-cnn",
        {
            "method": "integrated_gradients",
            "inputs": x.tolist(),
            "target": "predicted",
            "params": {"n_steps": 8},
            "render": {"kind": "overlay", "sign": "all", "examples": [2, 0]},
        },
    )
    assert r.status_code == 200, r.text
    renders = r.json()["renders"]
    assert [p["example"] for p in renders] == [2, 0]
    for p in renders:
        assert p["media_type"] == "image/png"
        im = png(base64.b64decode(p["b64"]))
        assert im.width == 480  # render.width's default
    # text: tokens highlighted in escaped HTML, one span per token
    r = post(
        server,
        "text-classifier",
        {
            "method": "integrated_gradients",
            "inputs": ["a <b>wonderful</b> film", "dull"],
            "target": "positive",
            "render": {"format": "html"},
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    page = base64.b64decode(body["renders"][0]["b64"]).decode()
    assert page.startswith(
        "<!DOCTYPE html>"
    )  # escaping itself: tests/service/serving/test_render.py
    spans = _spans(page)
    assert spans == body["tokens"][0]
    # tabular: a bar chart
    r = post(
        server,
        "tabular-mlp",
        {"method": "saliency", "inputs": [[1.0, 0, 0, 0.5, 0, 0, 0, 0]], "target": 1, "render": {}},
    )
    assert r.status_code == 200, r.text
    im = png(base64.b64decode(r.json()["renders"][0]["b64"]))
    assert im.height > 8 * 10  # a row per feature
    # the target by its label's name, the features by theirs, as wide as asked
    labels = httpx.get(f"{server.url}/v1/models/tabular-mlp").json()["output"]["labels"]
    features = httpx.get(f"{server.url}/v1/models/tabular-mlp").json()["inputs"][0]["features"]
    r = post(server, "tabular-mlp", {"method": "saliency", "inputs": [[1.0] * 8], "target": 1,
                                     "render": {"format": "html"}})  # fmt: skip
    page = base64.b64decode(r.json()["renders"][0]["b64"]).decode()
    assert f"{labels[1]} (class 1)" in page and all(f in page for f in features)
    r = post(server, "tabular-mlp", {"method": "saliency", "inputs": [[1.0] * 8], "target": 1,
                                     "render": {"width": 1000}})  # fmt: skip
    assert png(base64.b64decode(r.json()["renders"][0]["b64"])).width == 1000


def _spans(page: str) -> list[str]:
    class Spans(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.inside = False
            self.text: list[str] = []

        def handle_starttag(self, tag: str, attrs: Any) -> None:
            if tag == "span":
                self.inside = True
                self.text.append("")

        def handle_endtag(self, tag: str) -> None:
            self.inside = self.inside and tag != "span"

        def handle_data(self, data: str) -> None:
            if self.inside:
                self.text[-1] += data

    parser = Spans()
    parser.feed(page)
    return parser.text


def test_accept_returns_the_picture(server: Server) -> None:
    x = image_batch(1)
    body = {
        "method": "layer_gradcam",
        "inputs": x.tolist(),
        "target": "predicted",
        "params": {"layer": "features.3", "interpolate_to_input": True},
        "render": {"kind": "overlay", "sign": "positive"},
    }
    r = post(server, "image-cnn", body, headers={"Accept": "image/png"})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    png(r.content)
    r = post(server, "image-cnn", body, headers={"Accept": "text/html, application/json;q=0.5"})
    assert r.headers["content-type"].startswith("text/html") and "<img" in r.text
    # JSON preferred: the usual body
    r = post(server, "image-cnn", body, headers={"Accept": "application/json, image/png;q=0.1"})
    assert r.headers["content-type"] == "application/json" and "renders" in r.json()
    # two examples cannot be one picture: said before any work
    r = post(
        server,
        "image-cnn",
        {**body, "inputs": image_batch(2).tolist()},
        headers={"Accept": "image/png"},
    )
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "render", "examples"]


def test_gradcam_upsampled_to_the_input(server: Server) -> None:
    x = image_batch(2)
    base = {"method": "layer_gradcam", "inputs": x.tolist(), "target": [0, 1]}
    r = post(server, "image-cnn", {**base, "params": {"layer": "features.3"}})
    small = np.array(r.json()["attributions"])
    r = post(
        server,
        "image-cnn",
        {**base, "params": {"layer": "features.3", "interpolate_to_input": True}},
    )
    assert r.status_code == 200, r.text
    up = np.array(r.json()["attributions"])
    assert up.shape[-2:] == x.shape[-2:] and up.shape[:2] == small.shape[:2]
    # nearest (Captum's default): each layer cell repeated over its block of input pixels
    f = x.shape[-1] // small.shape[-1]
    np.testing.assert_allclose(up, small.repeat(f, axis=-1).repeat(f, axis=-2), rtol=1e-6)
    r = post(
        server,
        "image-cnn",
        {**base, "params": {"layer": "classifier.1", "interpolate_to_input": True}},
    )
    assert r.status_code == 422 and "interpolate_to_input" in str(r.json()["errors"])


def test_a_list_of_layers_gets_one_picture_per_layer(server: Server) -> None:
    x = image_batch(1)
    body = {
        "method": "layer_gradcam", "inputs": x.tolist(), "target": 0,
        "params": {"layer": ["features.0", "features.3"], "interpolate_to_input": True},
        "render": {"kind": "overlay", "sign": "positive"},
    }  # fmt: skip
    r = post(server, "image-cnn", body)
    assert r.status_code == 200, r.text
    pictures = r.json()["renders"]
    assert [p["layer"] for p in pictures] == ["features.0", "features.3"]
    assert all(base64.b64decode(p["b64"]).startswith(b"\x89PNG") for p in pictures)


def test_render_errors_before_the_work(server: Server) -> None:
    x = image_batch(1).tolist()
    cases = [
        ({"render": {"examples": [3]}}, ["body", "render", "examples", 0]),
        ({"render": {"colormap": "rainbow-ish"}}, ["body", "render", "colormap"]),
        (
            {
                "render": {"kind": "overlay"},
                "method": "layer_gradcam",
                "params": {"layer": "features.3"},
            },
            ["body", "render", "kind"],
        ),
        ({"render": {"format": "gif"}}, ["body", "render", "format"]),
    ]
    for extra, loc in cases:
        body = {"method": "saliency", "inputs": x, "target": 0, **extra}
        r = post(server, "image-cnn", body)
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == loc, r.json()
