"""Hugging Face image classifiers by directory (``source = "hf:DIR"``, CONTRACT §7.5): images
sent as ``{"image": "<base64>"}``, made into ``pixel_values`` by the directory's own image
processor, attributed with Captum's numbers (IntegratedGradients on those pixel_values), over
every route and the offline CLI; pictures over the original image at its size; bad images and
directories that cannot be served refused with the field and the problem."""

from __future__ import annotations

import base64
import io
import json
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

import model_registry
from model_registry.errors import RegistryError
from tests.hf_dirs import FLOWERS, vit_dir
from tests.model_registry.test_image_header import png_header
from tests.service.conftest import Server


def picture(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    """A random RGB image file."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


FILES = [picture(45, 30, 0), picture(24, 40, 1, "JPEG")]


def captum_ig(path: Path, files: list[bytes], target: list[int], n_steps: int = 50) -> Any:
    """Captum's IntegratedGradients on the processor's pixel_values (float64 model), zeros
    baseline; and the model's logits."""
    from captum.attr import IntegratedGradients
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(path).double().eval()
    processor = AutoImageProcessor.from_pretrained(path)
    images = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
    pixels = torch.from_numpy(processor(images=images, return_tensors="np")["pixel_values"])
    pixels = pixels.double()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(pixel_values=x).logits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        attr = IntegratedGradients(forward).attribute(
            pixels, baselines=torch.zeros_like(pixels), target=target, n_steps=n_steps
        )
        logits = forward(pixels)
    return attr.detach().numpy(), logits.detach().numpy()


@pytest.fixture(scope="module")
def vit_server(server: Server) -> tuple[Server, Path]:
    """The main server (tests/service/conftest.py), which serves two ViT directories: "flowers"
    (float64) and "cropped" (its processor crops the centre)."""
    return server, server.log.parent / "flowers"


def post(server: Server, body: dict[str, Any], model: str = "flowers") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60)


def test_the_directory_describes_the_model(vit_server: tuple[Server, Path]) -> None:
    server, _ = vit_server
    info = httpx.get(f"{server.url}/v1/models/flowers").json()
    assert info["kind"] == "image_classification"  # CONTRACT 7.5: the task, not "tensor"
    listed = httpx.get(f"{server.url}/v1/models").json()
    assert [m["kind"] for m in listed["models"] if m["id"] == "flowers"] == [info["kind"]]
    assert info["output"]["labels"] == list(FLOWERS.values())
    pixels = {
        "name": "pixel_values",
        "dtype": "float64",
        "shape": [None, 3, 32, 32],
        "features": None,
    }
    assert info["inputs"] == [pixels]
    assert info["layers"][0] == "model.vit.embeddings.patch_embeddings"
    assert info["layers"][1:] == ["model.vit.layers.0", "model.vit.layers.1"]


def test_integrated_gradients_equal_captums(vit_server: tuple[Server, Path]) -> None:
    """PNG and JPEG of different sizes, targets by label name and by index: Captum's
    IntegratedGradients on the same processor's pixel_values, zeros baseline by default."""
    server, path = vit_server
    images = [{"image": b64(f)} for f in FILES]
    r = post(server, {"method": "integrated_gradients", "inputs": images, "target": ["rose", 2],
                      "params": {"n_steps": 50}, "return_convergence_delta": True})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    want, logits = captum_ig(path, FILES, [1, 2])
    # Captum rounds the quadrature weights to float32: agreement to ~1e-7 of the largest value
    np.testing.assert_allclose(body["attributions"], want, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(body["outputs"], logits[[0, 1], [1, 2]], rtol=1e-9)
    assert np.abs(want).max() > 1e-3 and body["target"] == [1, 2]
    # KServe's {"image": {"b64": ...}} and a data: URL are the same images
    same = post(server, {"method": "integrated_gradients", "target": ["rose", 2],
                         "inputs": [{"image": {"b64": b64(FILES[0])}},
                                    {"image": "data:image/jpeg;base64," + b64(FILES[1])}],
                         "params": {"n_steps": 50}})  # fmt: skip
    np.testing.assert_allclose(same.json()["attributions"], body["attributions"], rtol=1e-12)


def test_pixel_values_as_a_tensor_are_the_same_input(vit_server: tuple[Server, Path]) -> None:
    server, path = vit_server
    want, _ = captum_ig(path, FILES[:1], [0], n_steps=8)
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(path)
    image = Image.open(io.BytesIO(FILES[0])).convert("RGB")
    values = processor(images=[image], return_tensors="np")["pixel_values"].tolist()
    r = post(server, {"method": "integrated_gradients", "inputs": values, "target": "tulip",
                      "params": {"n_steps": 8}})  # fmt: skip
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["attributions"], want, rtol=1e-6, atol=1e-8)


def test_every_route_takes_images(vit_server: tuple[Server, Path]) -> None:
    """KServe :predict and :explain (instances), an attribution job, a noise tunnel and a
    layer method: as on the built-ins."""
    server, path = vit_server
    images = [{"image": b64(f)} for f in FILES]
    _, logits = captum_ig(path, FILES, [0, 0], n_steps=2)
    pred = httpx.post(f"{server.url}/v1/models/flowers:predict", json={"instances": images})
    assert pred.status_code == 200, pred.text
    np.testing.assert_allclose(pred.json()["predictions"], logits, rtol=1e-9)
    body = {"method": "saliency", "target": "daisy"}
    sync = post(server, {**body, "inputs": images}).json()
    explain = httpx.post(f"{server.url}/v1/models/flowers:explain",
                         json={"instances": images, "parameters": body}, timeout=60)  # fmt: skip
    assert explain.status_code == 200, explain.text
    for i, e in enumerate(explain.json()["explanations"]):
        np.testing.assert_allclose(e["attributions"], sync["attributions"][i], rtol=1e-12)
    job = httpx.post(f"{server.url}/v1/models/flowers/attribution-jobs",
                     json={**body, "inputs": images}, timeout=60)  # fmt: skip
    assert job.status_code == 202, job.text
    for _ in range(600):
        info = httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}").json()
        if info["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    assert info["status"] == "succeeded", info
    result = httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}/result").json()
    np.testing.assert_allclose(result["attributions"], sync["attributions"], rtol=1e-12)
    tunnel = post(server, {"method": "integrated_gradients", "inputs": images, "seed": 3,
                           "target": "predicted",
                           "noise_tunnel": {"nt_type": "smoothgrad", "nt_samples": 3},
                           "params": {"n_steps": 4}})  # fmt: skip
    assert tunnel.status_code == 200, tunnel.text
    assert np.shape(tunnel.json()["attributions"]) == (2, 3, 32, 32)
    layer = post(server, {"method": "layer_gradient_x_activation", "inputs": images, "target": 1,
                          "params": {"layer": "model.vit.layers.1"}})  # fmt: skip
    assert layer.status_code == 200, layer.text
    assert np.shape(layer.json()["attributions"]) == (2, 17, 16)  # [CLS] and 16 patches


def _png_size(b64_png: str) -> tuple[int, int]:
    return Image.open(io.BytesIO(base64.b64decode(b64_png))).size


def test_pictures_overlay_the_original_at_its_size(vit_server: tuple[Server, Path]) -> None:
    """The overlay is drawn on the original image, not on the normalised pixel_values: where
    the processor crops (resize to 40, centre 32), the margins it cut show the original's
    own pixels, and the picture is as large as the original (plus its frame)."""
    server, _ = vit_server
    original = picture(300, 260, 5)
    r = post(server, {"method": "saliency", "inputs": [{"image": b64(original)}],
                      "target": 0, "render": {"kind": "overlay", "width": None}},
             "cropped")  # fmt: skip
    assert r.status_code == 200, r.text
    drawn = Image.open(io.BytesIO(base64.b64decode(r.json()["renders"][0]["b64"])))
    pixels = np.asarray(drawn.convert("RGB"))
    source = np.asarray(Image.open(io.BytesIO(original)).convert("RGB"))
    # find the original's top-left corner in the framed picture: its first 20×20 pixels lie
    # outside the crop (300 px → 40 → centre 32: the outer 10% on each side) and stay as they are
    rows, cols = drawn.height - source.shape[0], drawn.width - source.shape[1]
    found = [(y, x) for y in range(rows + 1) for x in range(cols + 1)
             if np.array_equal(pixels[y : y + 20, x : x + 20], source[:20, :20])]  # fmt: skip
    assert len(found) == 1, "the original's corner is not in the picture as it was"
    y, x = found[0]
    body = pixels[y : y + source.shape[0], x : x + source.shape[1]].astype(int)
    centre = (slice(100, 160), slice(100, 200))
    assert np.abs(body[centre] - source[centre]).mean() > 5  # the heat map is over the centre
    # and over the whole original when the processor only resizes
    plain = post(server, {"method": "saliency", "inputs": [{"image": b64(original)}],
                          "target": 0, "render": {"kind": "heatmap", "width": None}})  # fmt: skip
    width, height = _png_size(plain.json()["renders"][0]["b64"])
    assert width >= 300 and 260 < height < 400


@pytest.mark.parametrize(
    ("image", "loc", "match"),
    [
        (b64(b"hello, not an image"), ["body", "inputs", 1, "image"], "not an image"),
        ("%%% not base64 %%%", ["body", "inputs", 1, "image"], "not base64"),
        (b64(FILES[0][:60]), ["body", "inputs", 1, "image"], "truncated or corrupt"),
        (7, ["body", "inputs", 1], '{"image"'),
    ],
)
def test_bad_images_are_422_naming_the_example(
    vit_server: tuple[Server, Path], image: Any, loc: list[Any], match: str
) -> None:
    server, _ = vit_server
    inputs = [{"image": b64(FILES[0])}, {"image": image}]
    r = post(server, {"method": "saliency", "inputs": inputs, "target": 0})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == loc and match in r.json()["detail"], r.json()


def test_an_image_too_large_is_refused_before_it_is_decoded(
    vit_server: tuple[Server, Path],
) -> None:
    """413 over ATTRSERVE_MAX_IMAGE_PIXELS (CONTRACT 9.1: 40,000,000 by default), read from
    the headers before any image is decoded."""
    server, _ = vit_server
    huge = io.BytesIO()
    Image.new("1", (7200, 7200)).save(huge, format="PNG")  # 51.8 megapixels, a small file
    r = post(server, {"method": "saliency", "inputs": [{"image": b64(huge.getvalue())}]})
    assert r.status_code == 413 and "40,000,000 pixels in all" in r.json()["detail"], r.text
    assert r.json()["type"].endswith("/image_too_large")
    # a header alone declaring 10^10 pixels (Pillow's own bound raised through: a 500)
    bomb = {"image": b64(png_header(100_000, 100_000))}
    r = post(server, {"method": "saliency", "inputs": [{"image": b64(FILES[0])}, bomb]})
    assert r.status_code == 413 and "100000×100000" in r.json()["detail"], r.text
    assert r.json()["errors"][0]["loc"] == ["body", "inputs", 1, "image"]
    # and a request's images in all: the second of two 30-megapixel images is over
    half = io.BytesIO()
    Image.new("1", (6000, 5000)).save(half, format="PNG")
    r = post(server, {"method": "saliency", "inputs": [{"image": b64(half.getvalue())}] * 2})
    assert r.status_code == 413 and "10,000,000 left" in r.json()["detail"], r.text
    assert r.json()["errors"][0]["loc"] == ["body", "inputs", 1, "image"]


@pytest.mark.parametrize(
    ("model", "body", "loc", "match"),
    [
        ("flowers", {"inputs": ["a text"]}, ["body", "inputs"], "takes images"),
        ("tabular-mlp", {"inputs": [{"image": b64(FILES[0])}]}, ["body", "inputs"],
         "takes no encoded images"),
        ("flowers", {"inputs": [{"image": b64(FILES[0])}], "target": "orchid"},
         ["body", "target"], "orchid"),
        ("flowers", {"inputs": [{"image": b64(FILES[0])}, [[0.0]]]}, ["body", "inputs", 1],
         '{"image"'),
    ],
)  # fmt: skip
def test_inputs_the_model_does_not_take_are_422(
    vit_server: tuple[Server, Path], model: str, body: dict[str, Any], loc: list[Any], match: str
) -> None:
    server, _ = vit_server
    r = post(server, {"method": "saliency", **body}, model)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == loc and match in r.json()["detail"], r.json()


def test_a_directory_without_an_image_processor_stops_start_up(tmp_path: Path) -> None:
    vit_dir(tmp_path / "bare", processor=None)
    (tmp_path / "models.toml").write_text('[[models]]\nid = "bare"\nsource = "hf:bare"\n')
    with pytest.raises(RegistryError) as info:
        model_registry.load_specs(tmp_path / "models.toml")
    text = str(info.value)
    assert "'bare'" in text and "source" in text and "image processor" in text


def test_the_offline_cli_over_a_folder_of_images(tmp_path: Path) -> None:
    from service.cli import main as cli

    vit_dir(tmp_path / "flowers")
    (tmp_path / "models.toml").write_text('[[models]]\nid = "flowers"\nsource = "hf:flowers"\n')
    folder = tmp_path / "photos"
    folder.mkdir()
    for i, name in enumerate(["b.png", "a.jpg", "c.webp"]):
        fmt = {"png": "PNG", "jpg": "JPEG", "webp": "WEBP"}[name.split(".")[1]]
        (folder / name).write_bytes(picture(20 + i, 30, i, fmt))
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "out.npz"
    code = cli.main(["attribute", "--model", "flowers", "--models", str(tmp_path / "models.toml"),
                     "--method", "saliency", "--target", "tulip", "-q",
                     "--inputs", str(folder), "--output", str(out)])  # fmt: skip
    assert code == 0
    with np.load(out, allow_pickle=False) as z:
        assert z["attributions"].shape == (3, 3, 32, 32)
        assert z["file_name"].tolist() == ["a.jpg", "b.png", "c.webp"]
    lines = tmp_path / "images.jsonl"
    lines.write_text(json.dumps({"inputs": {"image": b64(FILES[0])}, "target": "rose"}) + "\n")
    code = cli.main(["attribute", "--model", "flowers", "--models", str(tmp_path / "models.toml"),
                     "--method", "saliency", "-q", "--inputs", str(lines),
                     "--output", str(tmp_path / "one.npz")])  # fmt: skip
    assert code == 0


def test_oip_takes_images_as_bytes_and_pixel_values(vit_server: tuple[Server, Path]) -> None:
    """tritonclient: BYTES elements are the image files (binary) or base64 (JSON), or the
    pixel_values as FP32; infer gives the logits, explain the attributions route's numbers."""
    http = pytest.importorskip("tritonclient.http")
    server, path = vit_server
    _, logits = captum_ig(path, FILES, [0, 0], n_steps=2)
    c = http.InferenceServerClient(server.url.removeprefix("http://"))
    for binary, items in ((True, FILES), (False, [b64(f).encode() for f in FILES])):
        inp = http.InferInput("pixel_values", [2], "BYTES")
        inp.set_data_from_numpy(np.array(items, dtype=object), binary_data=binary)
        res = c.infer("flowers", [inp])
        np.testing.assert_allclose(res.as_numpy("output"), logits, rtol=1e-9)
    sync = post(server, {"method": "saliency", "target": "rose",
                         "inputs": [{"image": b64(f)} for f in FILES]}).json()  # fmt: skip
    inp = http.InferInput("pixel_values", [2], "BYTES")
    inp.set_data_from_numpy(np.array(FILES, dtype=object))
    headers = {"content-type": "application/json"}
    body, length = http.InferenceServerClient.generate_request_body(
        [inp], parameters={"method": "saliency", "target": "rose"}
    )
    if length is not None:
        headers["Inference-Header-Content-Length"] = str(length)
    r = httpx.post(f"{server.url}/v2/models/flowers/explain", content=body, headers=headers)
    assert r.status_code == 200, r.text[:300]
    size = r.headers.get("inference-header-content-length")
    res = http.InferResult.from_response_body(r.content, header_length=size and int(size))
    np.testing.assert_allclose(res.as_numpy("attributions.pixel_values"), sync["attributions"])
    c.close()
    bad = http.InferInput("pixel_values", [1], "BYTES")
    bad.set_data_from_numpy(np.array([b"not an image"], dtype=object))
    c = http.InferenceServerClient(server.url.removeprefix("http://"))
    with pytest.raises(http.InferenceServerException, match="not an image"):
        c.infer("flowers", [bad])
    c.close()


def test_a_tensor_keyed_by_an_input_named_image_is_a_tensor(
    vit_server: tuple[Server, Path],
) -> None:
    """The built-in image-cnn's input is named ``image``: KServe instances keyed by it stay
    tensors, and only a base64 string there is an encoded image (refused by that model)."""
    server, _ = vit_server
    x = np.zeros((3, 32, 32)).tolist()
    r = httpx.post(f"{server.url}/v1/models/image-cnn:predict", json={"instances": [{"image": x}]})
    assert r.status_code == 200, r.text
    r = post(server, {"method": "saliency", "inputs": [{"image": b64(FILES[0])}], "target": 0},
             "image-cnn")  # fmt: skip
    assert r.status_code == 422 and "takes no encoded images" in r.json()["detail"], r.text
