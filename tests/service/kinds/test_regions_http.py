"""Regions over HTTP (CONTRACT §9.5): superpixel feature masks drawn by the server on each
image (the model's pixel_values for an encoded image) and returned with the answer, text units
(word, sentence, paragraph) with their character offsets, xrai and blur_ig equal to PAIR's
saliency, pictures outlining the segments, jobs and KServe; each refusal names its field."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from captum.attr import FeatureAblation
from PIL import Image

import model_registry
from methods.engine import superpixels
from model_registry.builtin.text import WordTokenizer
from tests.service.conftest import Server

sc = pytest.importorskip("saliency.core")

SLIC = {"superpixels": {"algorithm": "slic", "n_segments": 12, "compactness": 5}}
TEXTS = [
    "A great film. I loved the story!\n\nBut the acting was dull, so dull.",
    "Awful plot. Boring.",
]


def builtin(name: str) -> torch.nn.Module:
    specs = {s.id: s for s in model_registry.builtin_specs()}
    model: torch.nn.Module = model_registry.load(specs[name]).model
    return model.double().eval()


def images(n: int = 2) -> np.ndarray:
    """Images with edges (bright squares on a gradient): what superpixels are for."""
    from model_registry.builtin import image

    x, _ = image.make_data(n, torch.Generator().manual_seed(3))
    return x.numpy().astype(np.float64)


def post(server: Server, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=120)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def refused(r: httpx.Response, loc: list[Any], *words: str) -> None:
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["errors"][0]["loc"] == loc, problem
    for w in words:
        assert w in problem["detail"], problem["detail"]


@pytest.mark.parametrize("method", ["feature_ablation", "shapley_value_sampling"])
def test_superpixels_are_drawn_on_each_image_and_returned(server: Server, method: str) -> None:
    x = images()
    params = {"feature_mask": SLIC, **({"n_samples": 3} if "shapley" in method else {})}
    body = {"method": method, "inputs": x.tolist(), "target": [0, 3], "seed": 2, "params": params}
    got = ok(post(server, "image-cnn", body))
    segments = superpixels.segment_batch(x, superpixels.parse(SLIC))
    np.testing.assert_array_equal(np.array(got["feature_mask"]), segments)
    if method == "feature_ablation":  # Captum's FeatureAblation on those segments
        mask = torch.from_numpy(segments)[:, None]
        want = FeatureAblation(builtin("image-cnn")).attribute(
            torch.from_numpy(x), target=[0, 3], feature_mask=mask
        )
        np.testing.assert_allclose(got["attributions"], want.numpy(), rtol=1e-4, atol=1e-5)
    # every pixel of a segment shares its value: the segment is one feature
    a = np.array(got["attributions"])[0].sum(axis=0)
    for k in np.unique(segments[0]):
        assert np.ptp(a[segments[0] == k]) < 1e-5


def test_superpixels_of_an_encoded_image_are_the_processors_pixels(server: Server) -> None:
    """A Hugging Face image classifier: the segments are drawn on its pixel_values (32 x 32),
    not on the file, and the picture outlines them on the original photo."""
    from transformers import AutoImageProcessor

    ramp = np.linspace(0, 160, 52, dtype=np.uint8)  # a ramp with a bright square: edges
    pixels = np.repeat(np.stack([ramp, ramp[::-1], np.full(52, 60, np.uint8)], -1)[None], 40, 0)
    pixels[5:25, 10:30] = 250
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    data = base64.b64encode(buf.getvalue()).decode("ascii")
    grid = {"superpixels": {"algorithm": "grid", "size": [8, 8]}}
    body = {"method": "feature_ablation", "inputs": [{"image": data}], "target": 1,
            "params": {"feature_mask": SLIC}, "render": {"kind": "overlay"}}  # fmt: skip
    got = ok(post(server, "flowers", body))
    processor = AutoImageProcessor.from_pretrained(server.log.parent / "flowers")
    values = processor(images=[Image.fromarray(pixels)], return_tensors="np")["pixel_values"]
    want = superpixels.segment_batch(values.astype(np.float32), superpixels.parse(SLIC))
    np.testing.assert_array_equal(np.array(got["feature_mask"]), want)
    picture = Image.open(io.BytesIO(base64.b64decode(got["renders"][0]["b64"]))).convert("RGB")
    rgb = np.asarray(picture).astype(int)
    yellow = (rgb[..., 0] > 200) & (rgb[..., 1] > 170) & (rgb[..., 2] < 90)
    assert yellow.sum() > 50  # the segments' borders
    body["params"] = {"feature_mask": grid}
    cells = ok(post(server, "flowers", body))
    assert np.array(cells["feature_mask"]).max() == 15  # 4 x 4 cells of 32 px


def test_units_are_words_sentences_or_paragraphs(server: Server) -> None:
    """Each unit's tokens are ablated together: the answer equals Captum's FeatureAblation
    with that token mask (padding as the baseline), one value per unit, with its offsets."""
    model = builtin("text-classifier")
    tokenizer = WordTokenizer()
    ids, tokens = tokenizer(TEXTS)
    offsets = tokenizer.offsets(TEXTS)
    for units, want_units in (
        ("sentence", [["A great film.", "I loved the story!", "But the acting was dull, so dull."],
                      ["Awful plot.", "Boring."]]),
        ("paragraph", [["A great film. I loved the story!", "But the acting was dull, so dull."],
                       ["Awful plot. Boring."]]),
        ("word", [t.split() for t in TEXTS]),
    ):  # fmt: skip
        body = {"method": "feature_ablation", "inputs": TEXTS, "target": 1, "units": units}
        got = ok(post(server, "text-classifier", body))
        assert got["tokens"] == want_units
        for row, text in zip(got["units"], TEXTS, strict=True):
            assert [u["text"] for u in row] == [text[u["start"] : u["end"]] for u in row]
        mask = torch.zeros(ids.shape, dtype=torch.long)
        for i, spans in enumerate(offsets):
            starts = [u["start"] for u in got["units"][i]]
            for j, (a, _) in enumerate(spans):
                mask[i, j] = max(k for k, s in enumerate(starts) if s <= a)
        want = FeatureAblation(model).attribute(ids, target=1, baselines=0, feature_mask=mask)
        for i, row in enumerate(got["units"]):
            first = [int((mask[i, : len(tokens[i])] == k).nonzero()[0]) for k in range(len(row))]
            np.testing.assert_allclose(got["attributions"][i][: len(row)],
                                       want[i, first].numpy(), rtol=1e-4, atol=1e-6)  # fmt: skip
    picture = ok(post(server, "text-classifier", {**body, "units": "sentence", "render": {}}))
    assert picture["renders"][0]["media_type"] == "image/png"


def test_units_ride_in_jobs_and_kserve_explanations(server: Server) -> None:
    body = {"method": "kernel_shap", "inputs": TEXTS, "target": 0, "units": "sentence",
            "params": {"n_samples": 20}, "seed": 1}  # fmt: skip
    sync = ok(post(server, "text-classifier", body))
    url = f"{server.url}/v1/models/text-classifier/attribution-jobs"
    job = httpx.post(url, json=body, timeout=30).json()
    for _ in range(600):
        state = httpx.get(f"{server.url}/v1/jobs/{job['id']}", timeout=30).json()
        if state["status"] in ("succeeded", "failed"):
            break
        time.sleep(0.05)
    assert state["status"] == "succeeded", state
    result = httpx.get(f"{server.url}/v1/jobs/{job['id']}/result", timeout=30).json()
    assert result["units"] == sync["units"] and result["tokens"] == sync["tokens"]
    np.testing.assert_allclose(result["attributions"], sync["attributions"], rtol=1e-6)
    kserve = httpx.post(
        f"{server.url}/v1/models/text-classifier:explain",
        json={"instances": TEXTS, "parameters": {k: v for k, v in body.items() if k != "inputs"}},
        timeout=60,
    ).json()
    assert [e["units"] for e in kserve["explanations"]] == sync["units"]


def photo_file() -> tuple[str, np.ndarray]:
    """A small photograph as a PNG (base64), and the image itself ([H, W, 3] uint8)."""
    from skimage import data

    pixels = np.ascontiguousarray(data.astronaut()[::12, ::12][:36, :40])
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii"), pixels


def vit_reference(server: Server, pixels: np.ndarray, target: int) -> tuple[np.ndarray, Any]:
    """The flowers ViT (float64, as served) on its processor's pixel_values of ``pixels``
    ([H, W, C]), and saliency's call_model_function for ``target``."""
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    path = server.log.parent / "flowers"
    model = AutoModelForImageClassification.from_pretrained(path).double().eval()
    processor = AutoImageProcessor.from_pretrained(path)
    values = processor(images=[Image.fromarray(pixels)], return_tensors="np")["pixel_values"]

    def call(batch: np.ndarray, call_model_args: Any = None, expected_keys: Any = None) -> Any:
        t = torch.tensor(batch).double().permute(0, 3, 1, 2).requires_grad_(True)
        (g,) = torch.autograd.grad(model(pixel_values=t).logits[:, target].sum(), t)
        return {sc.INPUT_OUTPUT_GRADIENTS: g.permute(0, 2, 3, 1).numpy()}

    return values[0].transpose(1, 2, 0).astype(np.float64), call


@pytest.mark.parametrize("algorithm", ["full", "fast"])
def test_xrai_over_http_equals_saliency(server: Server, algorithm: str) -> None:
    """A Hugging Face image classifier served in float64 (XRAI's choices of regions follow
    its sums: a reference in another precision may choose otherwise on near ties)."""
    data, pixels = photo_file()
    body = {"method": "xrai", "inputs": [{"image": data}], "target": 2,
            "params": {"n_steps": 10, "algorithm": algorithm}, "render": {}}  # fmt: skip
    got = ok(post(server, "flowers", body))
    image, call = vit_reference(server, pixels, 2)
    extra = sc.XRAIParameters(steps=10, algorithm=algorithm, return_xrai_segments=True)
    want = sc.XRAI().GetMaskWithDetails(image, call, extra_parameters=extra)
    np.testing.assert_allclose(np.array(got["attributions"])[0, 0], want.attribution_mask,
                               rtol=1e-6, atol=1e-12)  # fmt: skip
    np.testing.assert_array_equal(np.array(got["feature_mask"])[0], want.segments)
    assert got["renders"][0]["media_type"] == "image/png"


def test_blur_ig_over_http_equals_saliency(server: Server) -> None:
    data, pixels = photo_file()
    body = {"method": "blur_ig", "inputs": [{"image": data}], "target": 0,
            "params": {"n_steps": 16, "max_sigma": 8}}  # fmt: skip
    got = ok(post(server, "flowers", body))
    image, call = vit_reference(server, pixels, 0)
    want = sc.BlurIG().GetMask(image, call, max_sigma=8, steps=16)
    np.testing.assert_allclose(np.array(got["attributions"])[0].transpose(1, 2, 0), want,
                               rtol=1e-7, atol=1e-12)  # fmt: skip


def test_the_image_methods_are_listed_for_image_models_only(server: Server) -> None:
    image = httpx.get(f"{server.url}/v1/models/image-cnn", timeout=10).json()["methods"]
    tabular = httpx.get(f"{server.url}/v1/models/tabular-mlp", timeout=10).json()["methods"]
    assert {"xrai", "blur_ig"} <= set(image)
    assert not {"xrai", "blur_ig"} & set(tabular)


def test_what_cannot_be_drawn_is_refused_with_its_field(server: Server) -> None:
    img = images(1).tolist()
    fa = {"method": "feature_ablation", "target": 0}
    cases = [
        ("tabular-mlp", {**fa, "inputs": [[0.0] * 8], "params": {"feature_mask": SLIC}},
         ["body", "params", "feature_mask"], ["segment images", "integer mask"]),
        ("text-classifier", {**fa, "inputs": ["fine"], "params": {"feature_mask": SLIC}},
         ["body", "params", "feature_mask"], ["takes texts", "units"]),
        ("image-cnn", {**fa, "inputs": img,
                       "params": {"feature_mask": {"superpixels": {"algorithm": "watershed"}}}},
         ["body", "params", "feature_mask", "superpixels", "algorithm"],
         ["slic, felzenszwalb, quickshift, grid"]),
        ("image-cnn", {**fa, "inputs": img, "params": {"feature_mask": {"superpixels": {
            "algorithm": "felzenszwalb", "scales": 3}}}},
         ["body", "params", "feature_mask", "superpixels", "scales"], ["scale, sigma, min_size"]),
        ("image-cnn", {**fa, "inputs": img, "units": "sentence"}, ["body", "units"],
         ["takes no text", "superpixels"]),
        ("text-classifier", {**fa, "method": "integrated_gradients", "inputs": ["fine"],
                             "units": "word"}, ["body", "units"], ["integrated_gradients"]),
        ("text-classifier", {**fa, "inputs": ["fine"], "units": "word",
                             "params": {"feature_mask": [[0]]}}, ["body", "units"], ["not both"]),
        ("text-classifier", {**fa, "inputs": [[5, 6]], "units": "word"}, ["body", "units"],
         ["texts themselves"]),
        ("text-classifier", {**fa, "inputs": ["   "], "units": "sentence"},
         ["body", "inputs", 0], ["empty"]),
        ("tabular-mlp", {"method": "xrai", "inputs": [[0.0] * 8], "target": 0},
         ["body", "method"], ["one image input"]),
        ("image-cnn", {"method": "blur_ig", "inputs": img, "target": 0, "baselines": 0.0,
                       "params": {"n_steps": 2}}, ["body", "baselines"], ["no baselines"]),
        ("image-cnn", {"method": "xrai", "inputs": img, "target": 0,
                       "params": {"algorithm": "fastest"}}, ["body", "params", "algorithm"],
         ["full", "fast"]),
    ]  # fmt: skip
    for model, body, loc, words in cases:
        refused(post(server, model, body), loc, *words)
