"""The tasks teams serve beside classifiers (CONTRACT 9.4), over HTTP, against Captum on the
wrappers its tutorials write by hand: question answering (BERT SQuAD: the largest start and
end logits, LayerIntegratedGradients on the word embeddings), semantic segmentation (the
segmentation tutorial's ``agg_segmentation_wrapper``, on a SegFormer directory and a model
of code), multi-label (per-label sigmoids) and regression (the value itself); each refused
input a 422 naming its field."""

from __future__ import annotations

import base64
import io
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from captum import attr as ca
from PIL import Image

from tests.hf_dirs import PETS, SCENE, TOPICS
from tests.service.conftest import Server, serve_in_thread
from tests.task_models import DETECT_LABELS, Segmenter, build, regressor, tagger

QUESTIONS = [
    {"question": "was the film good", "context": "the film was very good . the plot was dull"},
    {"question": "the plot", "context": "a story not bad , the acting great"},
]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    root = tmp_path_factory.mktemp("tasks")
    server = serve_in_thread(root, toml=build(root), job_chunk_cost=8)  # a job: 8 rows a chunk
    yield server, root
    assert server.app_thread is not None
    server.app_thread.stop()


def post(server: Server, model: str, body: dict[str, Any], route: str = "attributions") -> Any:
    return httpx.post(f"{server.url}/v1/models/{model}/{route}", json=body, timeout=120)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def refused(r: httpx.Response, *loc: Any) -> str:
    assert r.status_code == 422, r.text
    body = r.json()
    assert tuple(body["errors"][0]["loc"]) == ("body", *loc), body
    return str(body["detail"])


# -- question answering -------------------------------------------------------------------


def _squad(root: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer

    model = AutoModelForQuestionAnswering.from_pretrained(root / "qa").double().eval()
    return model, AutoTokenizer.from_pretrained(root / "qa")


def test_question_answering_equals_captums_squad_tutorial(tasks: tuple[Server, Path]) -> None:
    """Captum's BERT SQuAD tutorial: LayerIntegratedGradients on the word embeddings of
    ``squad_pos_forward_func`` (the largest start, or end, logit), the reference ids [CLS]
    and [SEP] kept and [PAD] elsewhere; summed over the embedding dim, one score a token."""
    server, root = tasks
    model, tok = _squad(root)
    for target, position in (("start", 0), ("end", 1)):
        body = ok(post(server, "qa", {"method": "integrated_gradients", "inputs": QUESTIONS[:1],
                                      "target": target, "params": {"n_steps": 32}}))  # fmt: skip
        q, c = QUESTIONS[0]["question"], QUESTIONS[0]["context"]
        enc = tok(q, c, return_tensors="pt")
        ids, types = enc["input_ids"], enc["token_type_ids"]
        ref = torch.where(
            (ids == tok.cls_token_id) | (ids == tok.sep_token_id), ids, tok.pad_token_id
        )

        def squad_pos_forward_func(inputs, token_type_ids=None, attention_mask=None, position=0):
            pred = model(inputs, token_type_ids=token_type_ids, attention_mask=attention_mask)
            pred = pred[position]
            return pred.max(1).values

        lig = ca.LayerIntegratedGradients(
            squad_pos_forward_func, model.bert.embeddings.word_embeddings
        )
        want = lig.attribute(
            ids, baselines=ref, n_steps=32,
            additional_forward_args=(types, enc["attention_mask"], position),
        ).sum(-1)  # fmt: skip
        np.testing.assert_allclose(
            body["attributions"], want.detach().numpy(), rtol=2e-4, atol=2e-5
        )
        assert body["tokens"][0] == tok.convert_ids_to_tokens(ids[0])
        with torch.no_grad():
            logits = model(ids, token_type_ids=types)[position][0]
        np.testing.assert_allclose(body["outputs"], [float(logits.max())], rtol=1e-5)


def test_the_answer_is_the_best_span_with_its_offsets(tasks: tuple[Server, Path]) -> None:
    server, root = tasks
    model, tok = _squad(root)
    body = ok(post(server, "qa", {"method": "saliency", "inputs": QUESTIONS}))
    assert body["target"] == [2, 2]  # "span" by default: start plus end
    for (
        example,
        answer,
    ) in zip(QUESTIONS, body["answers"], strict=True):
        enc = tok(example["question"], example["context"], return_offsets_mapping=True)
        with torch.no_grad():
            out = model(
                torch.tensor([enc["input_ids"]]),
                token_type_ids=torch.tensor([enc["token_type_ids"]]),
            )
        s, e = out.start_logits[0].double(), out.end_logits[0].double()
        seq = enc.sequence_ids()
        best, span = -np.inf, None
        for i in range(len(seq)):
            for j in range(i, min(i + 15, len(seq))):
                if seq[i] == 1 and seq[j] == 1 and float(s[i] + e[j]) > best:
                    best, span = float(s[i] + e[j]), (i, j)
        assert span is not None and answer["tokens"] == list(span)
        a, b = enc["offset_mapping"][span[0]][0], enc["offset_mapping"][span[1]][1]
        assert (answer["start"], answer["end"]) == (a, b)
        assert answer["text"] == example["context"][a:b]
        np.testing.assert_allclose(answer["score"], best, rtol=1e-5)
    # a batch answers as each example alone (padding is out of the maxima)
    alone = ok(post(server, "qa", {"method": "saliency", "inputs": QUESTIONS[1:]}))
    drop = [{k: v for k, v in a.items() if k != "score"} for a in alone["answers"]]
    assert drop == [{k: v for k, v in a.items() if k != "score"} for a in body["answers"][1:]]
    np.testing.assert_allclose(alone["answers"][0]["score"], body["answers"][1]["score"], rtol=1e-5)
    np.testing.assert_allclose(alone["outputs"], body["outputs"][1:], rtol=1e-5)


def test_question_answering_refuses_what_it_cannot_answer(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    r = post(server, "qa", {"method": "saliency", "inputs": [{"question": "why"}]})
    assert "context" in refused(r, "inputs", 0, "context")
    r = post(server, "qa", {"method": "saliency", "inputs": [{"question": "why", "context": " "}]})
    refused(r, "inputs", 0, "context")
    r = post(server, "qa", {"method": "saliency", "inputs": ["why is the film good"]})
    refused(r, "inputs", 0)
    r = post(server, "qa", {"method": "saliency", "inputs": QUESTIONS, "target": "middle"})
    assert "start" in refused(r, "target")
    r = post(server, "qa", {"method": "saliency", "inputs": QUESTIONS, "target": "predicted"})
    refused(r, "target")


# -- segmentation ---------------------------------------------------------------------------


def _agg(forward: Any, x: torch.Tensor, mask: torch.Tensor | None) -> Any:
    """Captum's segmentation tutorial's wrapper (``out_max`` fixed from ``x``)."""
    with torch.no_grad():
        out_max = forward(x).argmax(1, keepdim=True)

    def agg_segmentation_wrapper(inp: torch.Tensor) -> torch.Tensor:
        model_out = forward(inp)
        if mask is None:
            selected = torch.zeros_like(model_out[0:1]).scatter_(1, out_max, 1)
        else:
            selected = mask.to(model_out.dtype).expand_as(model_out[0:1])
        return (model_out * selected).sum(dim=(2, 3))

    return agg_segmentation_wrapper


def test_segmentation_of_code_equals_captums_wrapper(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    model = Segmenter().double().eval()
    x = torch.from_numpy(np.random.default_rng(0).random((2, 3, 16, 16)))
    mask = torch.zeros(16, 16, dtype=torch.float64)
    mask[3:11, 2:9] = 1
    cases = [
        ("integrated_gradients", {"n_steps": 20}, ca.IntegratedGradients, {"n_steps": 20}),
        ("layer_gradcam", {"layer": "features"}, lambda f: ca.LayerGradCam(f, model.features), {}),
        ("feature_ablation", {}, ca.FeatureAblation, {}),
    ]  # fmt: skip
    for region in ("predicted", "mask"):
        wire_region = "predicted" if region == "predicted" else mask.int().tolist()
        for method, params, captum, captum_params in cases:
            if method == "feature_ablation":
                fm = (torch.arange(256).reshape(1, 1, 16, 16) // 64).expand(1, 3, 16, 16)
                params = {"feature_mask": fm.tolist()}
                captum_params = {"feature_mask": fm}
            body = ok(post(server, "roads", {"method": method, "inputs": x.tolist(),
                                             "target": {"class": "road", "region": wire_region},
                                             "params": params}))  # fmt: skip
            assert body["target"] == [1, 1]
            for i in range(2):
                f = _agg(model, x[i : i + 1], None if region == "predicted" else mask)
                want = captum(f).attribute(x[i : i + 1], target=1, **captum_params)
                np.testing.assert_allclose(
                    body["attributions"][i], want[0].detach().numpy(), rtol=1e-7, atol=1e-9
                )
                np.testing.assert_allclose(
                    body["outputs"][i], float(f(x[i : i + 1])[0, 1].detach())
                )


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (20, 28, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def test_segformer_directory_equals_captums_wrapper(tasks: tuple[Server, Path]) -> None:
    """A SegFormer directory: its logits (a quarter of the input) upsampled to the processor's
    pixels, as its post-processing does; IG on pixel_values against Captum's wrapper."""
    from transformers import AutoImageProcessor, AutoModelForSemanticSegmentation

    server, root = tasks
    info = httpx.get(f"{server.url}/v1/models/scene").json()
    assert info["kind"] == "semantic_segmentation"
    assert info["output"] == {"shape": [3, 32, 32], "labels": list(SCENE.values())}
    files = [_png(1), _png(2)]
    images = [{"image": base64.b64encode(f).decode()} for f in files]
    body = ok(post(server, "scene", {"method": "integrated_gradients", "inputs": images,
                                     "target": [{"class": 0, "region": "predicted"},
                                                {"class": "flower", "region": "predicted"}],
                                     "params": {"n_steps": 16}}))  # fmt: skip
    model = AutoModelForSemanticSegmentation.from_pretrained(root / "scene").double().eval()
    processor = AutoImageProcessor.from_pretrained(root / "scene")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = torch.from_numpy(processor(images=pil, return_tensors="np")["pixel_values"])

    def upsampled(x: torch.Tensor) -> torch.Tensor:
        logits = model(pixel_values=x).logits
        return torch.nn.functional.interpolate(
            logits, size=x.shape[-2:], mode="bilinear", align_corners=False
        )

    for i, c in enumerate((0, 2)):
        x = pixels[i : i + 1].double()
        want = ca.IntegratedGradients(_agg(upsampled, x, None)).attribute(
            x, baselines=torch.zeros_like(x), target=c, n_steps=16
        )
        np.testing.assert_allclose(body["attributions"][i], want[0].detach().numpy(), rtol=1e-5,
                                   atol=1e-7)  # fmt: skip


def test_segmentation_refuses_bad_targets(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    x = np.zeros((1, 3, 16, 16)).tolist()
    base = {"method": "saliency", "inputs": x}
    # no target: each example's dominant class over the pixels predicted as it
    model = Segmenter().double().eval()
    with torch.no_grad():
        predicted = model(torch.tensor(x, dtype=torch.float64)).argmax(1).flatten()
    dominant = int(torch.bincount(predicted, minlength=3).argmax())
    assert ok(post(server, "roads", base))["target"] == [dominant]
    r = post(server, "roads", {**base, "target": "road"})
    assert "class over a region" in refused(r, "target")
    r = post(server, "roads", {**base, "target": {"class": 7, "region": "predicted"}})
    assert "0..2" in refused(r, "target", "class")
    r = post(server, "roads", {**base, "target": {"class": "truck", "region": "predicted"}})
    assert "road" in refused(r, "target", "class")
    r = post(server, "roads", {**base, "target": {"class": 1, "region": [[1, 0], [0, 1]]}})
    assert "16×16" in refused(r, "target", "region")
    r = post(
        server, "roads", {**base, "target": {"class": 1, "region": np.zeros((16, 16)).tolist()}}
    )
    assert "empty" in refused(r, "target", "region")
    r = post(
        server, "roads", {**base, "target": {"class": 1, "region": np.full((16, 16), 2).tolist()}}
    )
    refused(r, "target", "region")
    r = post(server, "roads", {**base, "target": 1})
    refused(r, "target")
    r = post(server, "roads", {**base, "target": {"class": 1, "region": "predicted"},
                               "output": "probability"})  # fmt: skip
    refused(r, "output")


# -- multi-label and regression -------------------------------------------------------------


def test_multi_label_probabilities_are_sigmoids(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    model = tagger().double().eval()
    x = torch.from_numpy(np.random.default_rng(3).normal(size=(3, 6)))
    body = ok(post(server, "tags", {"method": "integrated_gradients", "inputs": x.tolist(),
                                    "target": "c", "output": "probability"}))  # fmt: skip
    want = ca.IntegratedGradients(lambda v: torch.sigmoid(model(v))).attribute(x, target=2)
    np.testing.assert_allclose(body["attributions"], want.detach().numpy(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(body["outputs"], torch.sigmoid(model(x))[:, 2].detach().numpy())
    # a Hugging Face directory whose config says multi_label_classification
    info = httpx.get(f"{server.url}/v1/models/topics").json()
    assert info["kind"] == "multi_label_classification"
    assert info["output"]["labels"] == list(TOPICS.values())
    body = ok(post(server, "topics", {"method": "feature_ablation", "inputs": ["the plot was dull"],
                                      "target": "music", "output": "probability"}))  # fmt: skip
    assert 0 < body["outputs"][0] < 1


def test_regression_attributes_the_value(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    model = regressor().double().eval()
    x = torch.from_numpy(np.random.default_rng(4).normal(size=(2, 5)))
    body = ok(post(server, "price", {"method": "integrated_gradients", "inputs": x.tolist()}))
    want = ca.IntegratedGradients(model).attribute(x)
    np.testing.assert_allclose(body["attributions"], want.detach().numpy(), rtol=1e-7, atol=1e-10)
    assert body["target"] is None
    refused(
        post(server, "price", {"method": "saliency", "inputs": x.tolist(), "target": 0}), "target"
    )
    r = post(server, "price", {"method": "saliency", "inputs": x.tolist(), "output": "log_odds"})
    refused(r, "output")
    info = httpx.get(f"{server.url}/v1/models/score").json()
    assert (info["kind"], info["output"]) == ("regression", {"shape": [1], "labels": []})
    ok(post(server, "score", {"method": "integrated_gradients", "inputs": ["a good film"]}))


# -- jobs and the protocols -----------------------------------------------------------------


def _job(server: Server, model: str, body: dict[str, Any]) -> dict[str, Any]:
    """A job of ``body`` run to its end; its result."""
    r = post(server, model, body, "attribution-jobs")
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = httpx.get(f"{server.url}/v1/jobs/{job}").json()["status"]
        if status in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    assert status == "succeeded", httpx.get(f"{server.url}/v1/jobs/{job}").text
    return ok(httpx.get(f"{server.url}/v1/jobs/{job}/result"))


def test_jobs_answer_as_the_route(tasks: tuple[Server, Path]) -> None:
    """A job of each task answers as the synchronous route: its answers, its regions per
    example (the server's chunks: one example each)."""
    server, _ = tasks
    body = {"method": "integrated_gradients", "inputs": QUESTIONS, "target": "start",
            "params": {"n_steps": 8}}  # fmt: skip
    want = ok(post(server, "qa", body))
    got = _job(server, "qa", body)
    assert [a["text"] for a in got["answers"]] == [a["text"] for a in want["answers"]]
    np.testing.assert_allclose(got["outputs"], want["outputs"], rtol=1e-5)
    x = np.random.default_rng(5).random((3, 3, 16, 16))
    mask = np.zeros((16, 16), dtype=int)
    mask[:8] = 1
    targets = [{"class": 0, "region": mask.tolist()}, {"class": 1, "region": (1 - mask).tolist()},
               {"class": "car", "region": mask.tolist()}]  # fmt: skip
    body = {"method": "integrated_gradients", "inputs": x.tolist(), "target": targets,
            "params": {"n_steps": 8}}  # fmt: skip
    want = ok(post(server, "roads", body))
    got = _job(server, "roads", body)
    assert got["target"] == want["target"] == [0, 1, 2]
    np.testing.assert_allclose(got["attributions"], want["attributions"], rtol=1e-9)
    np.testing.assert_allclose(got["outputs"], want["outputs"], rtol=1e-9)


def test_kserve_and_oip_explain_question_answering(tasks: tuple[Server, Path]) -> None:
    from tests.service.compat.test_compat import kserve_client, kserve_explain, run

    server, _ = tasks
    want = ok(post(server, "qa", {"method": "saliency", "inputs": QUESTIONS}))
    got = kserve_explain(server, "qa", {"instances": QUESTIONS,
                                        "parameters": {"method": "saliency"}})  # fmt: skip
    for i, e in enumerate(got["explanations"]):
        width = len(want["tokens"][i])
        np.testing.assert_allclose(e["attributions"][:width], want["attributions"][i][:width],
                                   rtol=1e-5)  # fmt: skip
        assert e["answer"]["text"] == want["answers"][i]["text"]

    async def predict() -> Any:
        client = kserve_client("v1")
        try:
            return await client.infer(server.url, {"instances": QUESTIONS}, model_name="qa")
        finally:
            await client.close()

    predicted = run(predict())
    assert [a["text"] for a in predicted["answers"]] == [a["text"] for a in want["answers"]]
    # OIP: one BYTES input per field
    head = {
        "inputs": [
            {"name": f, "shape": [2], "datatype": "BYTES", "data": [q[f] for q in QUESTIONS]}
            for f in ("question", "context")
        ],
        "parameters": {"method": "saliency"},
        "outputs": [{"name": n, "parameters": {"binary_data": False}}
                    for n in ("answers", "answers.offsets", "outputs")],
    }  # fmt: skip
    r = httpx.post(f"{server.url}/v2/models/qa/explain", json=head, timeout=60)
    assert r.status_code == 200, r.text
    outs = {o["name"]: o for o in r.json()["outputs"]}
    assert outs["answers"]["data"] == [a["text"] for a in want["answers"]]
    flat = outs["answers.offsets"]["data"]
    assert flat == [v for a in want["answers"] for v in (a["start"], a["end"])]
    meta = httpx.get(f"{server.url}/v2/models/qa").json()
    assert [i["name"] for i in meta["inputs"]] == ["question", "context"]
    head["inputs"] = head["inputs"][:1]
    r = httpx.post(f"{server.url}/v2/models/qa/explain", json=head, timeout=60)
    assert r.status_code == 422 and "context" in r.text


def test_kserve_explains_segmentation_and_multi_label(tasks: tuple[Server, Path]) -> None:
    from tests.service.compat.test_compat import kserve_explain

    server, _ = tasks
    x = np.random.default_rng(6).random((2, 3, 16, 16)).tolist()
    params = {"method": "saliency", "target": {"class": "road", "region": "predicted"}}
    want = ok(post(server, "roads", {**params, "inputs": x}))
    got = kserve_explain(server, "roads", {"instances": x, "parameters": params})
    for i, e in enumerate(got["explanations"]):
        np.testing.assert_allclose(e["attributions"], want["attributions"][i], rtol=1e-9)
        assert e["target"] == 1
    rows = np.random.default_rng(7).normal(size=(2, 6)).tolist()
    params = {"method": "saliency", "target": "b", "output": "probability"}
    want = ok(post(server, "tags", {**params, "inputs": rows}))
    got = kserve_explain(server, "tags", {"instances": rows, "parameters": params})
    assert [e["output"] for e in got["explanations"]] == pytest.approx(want["outputs"])


# -- object detection -----------------------------------------------------------------------


def gradcam_box_score(det: dict[str, torch.Tensor], box: list[float], label: int) -> Any:
    """pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` rule, literally (one wanted box): the
    best-IoU detection of any label; its IoU plus its score where the IoU exceeds 0.5 and the
    label matches, else 0. Returns (value, the detection's score or None)."""
    if len(det["boxes"]) == 0:
        return 0.0, None
    from model_registry.detection import box_iou

    ious = box_iou(torch.tensor([box], dtype=det["boxes"].dtype), det["boxes"])
    index = ious.argmax()
    if ious[0, index] > 0.5 and det["labels"][index] == label:
        return float(ious[0, index] + det["scores"][index]), float(det["scores"][index])
    return 0.0, None


def test_detection_scores_the_box_as_grad_cams_target(tasks: tuple[Server, Path]) -> None:
    """Feature ablation and integrated gradients of the detector's score for a box: Captum on
    a wrapper scoring the box as CONTRACT 9.4 takes grad-cam's rule (the best same-label
    detection's score), which equals grad-cam's literal value less the IoU where both pick
    the same detection."""
    from tests.task_models import Detector

    server, _ = tasks
    model = Detector().double().eval()
    x = torch.from_numpy(np.random.default_rng(8).random((2, 3, 32, 32)))
    with torch.no_grad():
        dets = model(x)
    top = [{"box": d["boxes"][0].tolist(), "label": int(d["labels"][0])} for d in dets]

    def score(inp: torch.Tensor, i: int) -> torch.Tensor:
        from model_registry.detection import box_score

        out = model(inp)
        box = torch.tensor(top[i]["box"], dtype=torch.float64)
        label = torch.tensor(top[i]["label"])
        return torch.stack([box_score(d, box, label, 0.5) for d in out])

    fm = (torch.arange(1024).reshape(1, 1, 32, 32) // 128).expand(1, 3, 32, 32)
    body = ok(post(server, "cars", {"method": "feature_ablation", "inputs": x.tolist(),
                                    "params": {"feature_mask": fm.tolist()}}))  # fmt: skip
    assert body["target"] == top  # each image's top detection by default
    assert [d["labels"] for d in body["detections"]] == [d["labels"].tolist() for d in dets]
    for i in range(2):
        want = ca.FeatureAblation(lambda v, i=i: score(v, i)).attribute(
            x[i : i + 1], feature_mask=fm
        )
        np.testing.assert_allclose(body["attributions"][i], want[0].numpy(), rtol=1e-9, atol=1e-12)
        literal, picked = gradcam_box_score(dets[i], top[i]["box"], top[i]["label"])
        assert picked is not None and body["outputs"][i] == pytest.approx(picked)
        assert literal == pytest.approx(picked + 1.0)  # the box is its own detection: IoU 1
    # a given box, gradients through the detector's scores
    given = {"box": [b + 1 for b in top[1]["box"]], "label": DETECT_LABELS[top[1]["label"]]}
    body = ok(post(server, "cars", {"method": "integrated_gradients", "inputs": x[1:].tolist(),
                                    "target": given, "params": {"n_steps": 16}}))  # fmt: skip
    top[1]["box"] = given["box"]
    want = ca.IntegratedGradients(lambda v: score(v, 1)).attribute(x[1:], n_steps=16)
    np.testing.assert_allclose(body["attributions"], want.detach().numpy(), rtol=1e-7, atol=1e-10)


def test_detection_refuses_boxes_it_cannot_score(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    x = np.random.default_rng(9).random((1, 3, 32, 32)).tolist()
    far = {"box": [0.0, 0.0, 1.0, 1.0], "label": "car"}
    r = post(server, "cars", {"method": "saliency", "inputs": x, "target": far})
    assert "matches no detection" in refused(r, "target", "box")
    r = post(server, "cars", {"method": "saliency", "inputs": x,
                              "target": {"box": [3, 3, 1, 9], "label": 0}})  # fmt: skip
    refused(r, "target", "box")
    r = post(server, "cars", {"method": "saliency", "inputs": x,
                              "target": {"box": [0, 0, 9, 9], "label": "truck"}})  # fmt: skip
    assert "car" in refused(r, "target", "label")
    r = post(server, "cars", {"method": "saliency", "inputs": x, "target": {"box": [0, 0, 9, 9]}})
    refused(r, "target")


def test_a_hugging_face_detector_is_scored_per_query(tasks: tuple[Server, Path]) -> None:
    """A YOLOS directory (DETR-style output): every detection token a detection, its box in
    the processor's pixels; occlusion of the top detection's score against Captum."""
    from transformers import AutoImageProcessor, AutoModelForObjectDetection

    from model_registry.detection import BoxScore

    server, root = tasks
    info = httpx.get(f"{server.url}/v1/models/pets").json()
    assert info["kind"] == "object_detection" and info["output"]["labels"] == list(PETS.values())
    files = [_png(3)]
    images = [{"image": base64.b64encode(f).decode()} for f in files]
    params = {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}
    body = ok(post(server, "pets", {"method": "occlusion", "inputs": images, "params": params}))
    model = AutoModelForObjectDetection.from_pretrained(root / "pets").eval()
    processor = AutoImageProcessor.from_pretrained(root / "pets")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = torch.from_numpy(processor(images=pil, return_tensors="np")["pixel_values"])
    wrapped = BoxScore(model, hf=True)
    target = body["target"][0]
    box = torch.tensor([target["box"]])
    label = torch.tensor([target["label"]])
    want = ca.Occlusion(
        lambda v: wrapped(v, box.expand(len(v), 4), label.expand(len(v)))
    ).attribute(pixels, sliding_window_shapes=(3, 8, 8), strides=(3, 8, 8))
    np.testing.assert_allclose(body["attributions"], want.detach().numpy(), rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        out = model(pixel_values=pixels)
    probs = out.logits.softmax(-1)[0, :, :-1]
    assert body["outputs"][0] == pytest.approx(float(probs.max()), rel=1e-5)


def _magenta(render: dict[str, Any]) -> np.ndarray:
    """Where a rendered picture is drawn in the outlines' colour."""
    from service.serving.marks import MARK_RGB

    picture = np.asarray(Image.open(io.BytesIO(base64.b64decode(render["b64"]))).convert("RGB"))
    near = np.abs(picture.astype(int) - np.array(MARK_RGB)).max(-1) < 40  # scaled to fit
    return near


def test_pictures_outline_the_region_and_the_box(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    x = np.random.default_rng(10).random((1, 3, 16, 16)).tolist()
    mask = np.zeros((16, 16), dtype=int)
    mask[4:12, 4:12] = 1
    base = {"method": "saliency", "inputs": x, "render": {"kind": "heatmap"}}
    body = ok(post(server, "roads", {**base, "target": {"class": 1, "region": mask.tolist()}}))
    outlined = _magenta(body["renders"][0])
    assert outlined.any()
    rows, cols = np.nonzero(outlined)  # the square's edge, drawn where the map is
    assert rows.max() - rows.min() == cols.max() - cols.min() > 0
    body = ok(post(server, "roads", {**base, "target": {"class": 1, "region": "predicted"}}))
    assert _magenta(body["renders"][0]).any()
    x = np.random.default_rng(11).random((1, 3, 32, 32)).tolist()
    body = ok(post(server, "cars", {"method": "saliency", "inputs": x,
                                    "render": {"kind": "heatmap"}}))  # fmt: skip
    assert _magenta(body["renders"][0]).sum() > 20  # the top detection's box
    photo = base64.b64encode(_png(4)).decode()
    body = ok(post(server, "pets", {"method": "saliency", "inputs": [{"image": photo}],
                                    "render": {"kind": "overlay"}}))  # fmt: skip
    assert _magenta(body["renders"][0]).any()  # drawn on the original photo


# -- image–text similarity ------------------------------------------------------------------


def _clip(root: Path, files: list[bytes], texts: list[str]) -> tuple[Any, Any, Any, Any]:
    """The CLIP directory's model (float64), pixel_values, ids and attention mask."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(root / "clip").double().eval()
    processor = AutoImageProcessor.from_pretrained(root / "clip")
    tok = AutoTokenizer.from_pretrained(root / "clip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pil = [Image.open(io.BytesIO(f)).convert("RGB") for f in files]
        pixels = torch.from_numpy(processor(images=pil, return_tensors="np")["pixel_values"])
    enc = tok(texts, padding=True, return_tensors="pt")
    return model, pixels.double(), enc["input_ids"], enc["attention_mask"]


def test_image_text_similarity_attributes_both_at_once(tasks: tuple[Server, Path]) -> None:
    """Integrated gradients along one path for the pixels and the token embeddings, and
    feature ablation of patches and tokens together, against Captum on the hand-written
    wrapper of ``logits_per_image``'s diagonal."""
    server, root = tasks
    files, texts = [_png(5), _png(6)], ["a good film", "the plot was dull"]
    inputs = [
        {"image": base64.b64encode(f).decode(), "text": t}
        for f, t in zip(files, texts, strict=True)
    ]
    model, pixels, ids, mask = _clip(root, files, texts)
    emb = model.text_model.embeddings.token_embedding
    base_ids = torch.where((ids == 2) | (ids == 3) | (mask == 0), ids, torch.zeros_like(ids))

    def similarity(px: torch.Tensor, embeds: torch.Tensor, at: torch.Tensor,
                   attention: torch.Tensor) -> torch.Tensor:  # fmt: skip
        handle = emb.register_forward_hook(lambda _m, _i, _o: embeds)
        try:
            out = model(pixel_values=px, input_ids=at, attention_mask=attention)
        finally:
            handle.remove()
        return out.logits_per_image.diagonal()

    body = ok(post(server, "match", {"method": "integrated_gradients", "inputs": inputs,
                                     "params": {"n_steps": 16}}))  # fmt: skip
    with torch.no_grad():
        embeds, base_embeds = emb(ids), emb(base_ids)
    want = ca.IntegratedGradients(similarity).attribute(
        (pixels, embeds), baselines=(torch.zeros_like(pixels), base_embeds),
        additional_forward_args=(ids, mask), n_steps=16,
    )  # fmt: skip
    np.testing.assert_allclose(body["attributions"]["image"], want[0].numpy(), rtol=1e-4,
                               atol=1e-6)  # fmt: skip
    text = (want[1].sum(-1) * mask).numpy()
    for i in range(2):
        width = int(mask[i].sum())
        np.testing.assert_allclose(body["attributions"]["text"][i][:width], text[i][:width],
                                   rtol=1e-4, atol=1e-6)  # fmt: skip
    with torch.no_grad():
        sims = model(pixel_values=pixels, input_ids=ids, attention_mask=mask).logits_per_image
    np.testing.assert_allclose(body["outputs"], sims.diagonal().numpy(), rtol=1e-5)
    # feature ablation: 8x8 patches and tokens, one feature each, hidden together
    body = ok(post(server, "match", {"method": "feature_ablation", "inputs": inputs[:1]}))
    patches = (torch.arange(32) // 8)[:, None] * 4 + (torch.arange(32) // 8)[None, :]
    pmask = patches.expand(1, 3, 32, 32)
    tmask = torch.arange(ids.shape[1])[None] + 16

    def plain(px: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
        attention = mask[:1].expand(len(at), -1)
        return model(
            pixel_values=px, input_ids=at, attention_mask=attention
        ).logits_per_image.diagonal()

    width = int(mask[0].sum())
    want = ca.FeatureAblation(plain).attribute(
        (pixels[:1], ids[:1, :width]), baselines=(0, base_ids[:1, :width]),
        feature_mask=(pmask, tmask[:, :width]),
    )  # fmt: skip
    np.testing.assert_allclose(body["attributions"]["image"][0], want[0][0].numpy(), rtol=1e-4,
                               atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(body["attributions"]["text"][0][:width], want[1][0].numpy(),
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    assert body["tokens"][0] == ["[CLS]", "a", "good", "film", "[SEP]"]


def test_image_text_pairs_over_kserve_and_their_refusals(tasks: tuple[Server, Path]) -> None:
    from tests.service.compat.test_compat import kserve_explain

    server, _ = tasks
    photo = base64.b64encode(_png(7)).decode()
    pair = {"image": photo, "text": "a great story"}
    want = ok(post(server, "match", {"method": "saliency", "inputs": [pair]}))
    got = kserve_explain(server, "match", {"instances": [pair],
                                           "parameters": {"method": "saliency"}})  # fmt: skip
    image, text = got["explanations"][0]["attributions"]
    np.testing.assert_allclose(image, want["attributions"]["image"][0], rtol=1e-6)
    np.testing.assert_allclose(text, want["attributions"]["text"][0], rtol=1e-6)
    r = post(server, "match", {"method": "saliency", "inputs": [{"image": photo}]})
    assert "text" in refused(r, "inputs", 0, "text")
    r = post(server, "match", {"method": "saliency", "inputs": [{"text": "a film"}]})
    refused(r, "inputs", 0, "image")
    r = post(server, "match", {"method": "saliency", "inputs": [pair], "target": 0})
    refused(r, "target")
    r = post(server, "match", {"method": "occlusion", "inputs": [pair]})
    assert r.status_code in (400, 422) and "integrated_gradients" in r.text


def test_image_text_pairs_as_a_job_and_over_oip(tasks: tuple[Server, Path]) -> None:
    server, _ = tasks
    photos = [base64.b64encode(_png(k)).decode() for k in (8, 9, 10)]
    texts = ["a good film", "the plot", "very bad acting"]
    pairs = [{"image": p, "text": t} for p, t in zip(photos, texts, strict=True)]
    body = {"method": "integrated_gradients", "inputs": pairs, "params": {"n_steps": 8}}
    want = ok(post(server, "match", body))
    got = _job(server, "match", body)  # chunks of one pair each (8 rows a chunk)
    np.testing.assert_allclose(got["attributions"]["image"], want["attributions"]["image"],
                               rtol=1e-5, atol=1e-7)  # fmt: skip
    np.testing.assert_allclose(got["attributions"]["text"], want["attributions"]["text"],
                               rtol=1e-5, atol=1e-7)  # fmt: skip
    assert got["tokens"] == want["tokens"]
    head = {
        "inputs": [
            {"name": "image", "shape": [3], "datatype": "BYTES", "data": photos},
            {"name": "text", "shape": [3], "datatype": "BYTES", "data": texts},
        ],
        "parameters": {"method": "integrated_gradients", "params": {"n_steps": 8}},
        "outputs": [{"name": "outputs", "parameters": {"binary_data": False}}],
    }
    r = httpx.post(f"{server.url}/v2/models/match/explain", json=head, timeout=60)
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    np.testing.assert_allclose(out["data"], want["outputs"], rtol=1e-5)
