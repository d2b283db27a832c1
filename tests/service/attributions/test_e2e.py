"""End to end: a real uvicorn process, real workers, every built-in model, batching, errors."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import methods
import model_registry
from tests.service.conftest import Server
from tests.service.helpers import b64, from_b64

TAB_X = [[1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0], [-1.2, 0.5, 0.3, -0.8, 0.2, 0.1, -0.3, 0.6]]


def image_batch(n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    from model_registry.builtin import image

    x, y = image.make_data(n, torch.Generator().manual_seed(7))
    return x.numpy(), y.numpy()


def post(c: httpx.Client, model: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return c.post(f"/v1/models/{model}/attributions", json=body, **kw)


def ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


CASES = [
    ("tabular-mlp", "saliency", {}),
    (
        "tabular-mlp",
        "integrated_gradients",
        {"params": {"n_steps": 32}, "return_convergence_delta": True},
    ),
    ("tabular-mlp", "input_x_gradient", {}),
    ("tabular-mlp", "deeplift", {"return_convergence_delta": True}),
    ("tabular-mlp", "gradient_shap", {"baselines": [[0.0] * 8, [0.5] * 8], "seed": 3}),
    ("tabular-mlp", "feature_ablation", {}),
    ("tabular-mlp", "shapley_value_sampling", {"seed": 1, "params": {"n_samples": 4}}),
    ("tabular-mlp", "layer_conductance", {"params": {"layer": "fc2"}}),
    ("tabular-mlp", "integrated_gradients", {"noise_tunnel": {"nt_samples": 3}, "seed": 0}),
    ("image-cnn", "saliency", {}),
    ("image-cnn", "integrated_gradients", {"params": {"n_steps": 16}}),
    ("image-cnn", "guided_backprop", {}),
    (
        "image-cnn",
        "occlusion",
        {"params": {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}},
    ),
    ("image-cnn", "layer_gradcam", {"params": {"layer": "features.3"}}),
    ("text-classifier", "integrated_gradients", {}),
    ("text-classifier", "input_x_gradient", {}),
    ("text-classifier", "saliency", {}),
    ("text-classifier", "feature_ablation", {}),
]


def _inputs(model: str, encoding: str) -> tuple[Any, tuple[int, ...]]:
    if model == "tabular-mlp":
        x = np.array(TAB_X, dtype=np.float32)
    elif model == "image-cnn":
        x = image_batch()[0]
    else:
        x = np.array([[5, 6, 1, 0], [7, 3, 2, 9]], dtype=np.int64)
    return (b64(x) if encoding == "base64" else x.tolist()), x.shape


@pytest.mark.parametrize(
    ("model", "method", "extra"), CASES, ids=[f"{m}-{k}-{i}" for i, (m, k, _) in enumerate(CASES)]
)
def test_builtin_models_and_methods(
    server: Server, model: str, method: str, extra: dict[str, Any]
) -> None:
    with server.client() as c:
        layers = ok(c.get(f"/v1/models/{model}"))["layers"]
        if extra.get("params", {}).get("layer") not in (None, *layers):
            pytest.fail(f"{model} does not expose {extra['params']['layer']}: {layers}")
        encoding = "base64" if method == "saliency" else "json"
        inputs, shape = _inputs(model, encoding)
        body = {
            "method": method,
            "inputs": inputs,
            "target": [0, 1],
            "output_encoding": encoding,
            **extra,
        }
        res = ok(post(c, model, body))
    attrs = from_b64(res["attributions"]) if encoding == "base64" else np.array(res["attributions"])
    n = shape[0]
    assert attrs.shape[0] == n and np.isfinite(attrs).all()
    if model == "text-classifier" and method != "feature_ablation":
        assert res["attributed_layer"] == "embedding" and res["requested_method"] == method
        assert attrs.shape == shape  # one score per token
    elif res["method"] == method and not method.startswith("layer"):
        assert attrs.shape == shape
    outputs = from_b64(res["outputs"]) if encoding == "base64" else np.array(res["outputs"])
    assert outputs.shape == (n,) and res["target"] == [0, 1]
    assert isinstance(res["params"], dict)
    assert res["timing_ms"]["total"] >= res["timing_ms"]["compute"]


def test_ground_truth_tabular(server: Server) -> None:
    """Only features 0 and 3 decide the class: IG must put its mass there."""
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)
    with server.client() as c:
        res = ok(
            post(
                c,
                "tabular-mlp",
                {"method": "integrated_gradients", "inputs": x.tolist(), "target": "predicted"},
            )
        )
    a = np.abs(np.array(res["attributions"]))
    share = a[:, [0, 3]].sum(axis=1) / a.sum(axis=1)
    assert np.median(share) > 0.8, share


def test_ground_truth_image(server: Server) -> None:
    """The class is the quadrant of a bright square: saliency mass lies in that quadrant."""
    from model_registry.builtin.image import quadrant_mask

    x, y = image_batch(6)
    with server.client() as c:
        res = ok(
            post(
                c,
                "image-cnn",
                {
                    "method": "integrated_gradients",
                    "inputs": b64(x),
                    "target": y.tolist(),
                    "output_encoding": "base64",
                },
            )
        )
    a = np.abs(from_b64(res["attributions"])).sum(axis=1)
    for i, cls in enumerate(y):
        inside = a[i][quadrant_mask(int(cls)).numpy()].sum()
        assert inside > 0.6 * a[i].sum()


def test_ground_truth_text_raw(server: Server) -> None:
    """Sentiment words decide: from raw text, they get the largest per-token scores."""
    with server.client() as c:
        res = ok(
            post(
                c,
                "text-classifier",
                {
                    "method": "integrated_gradients",
                    "inputs": ["the plot was great", "an awful film"],
                    "target": "positive",
                },
            )
        )
    assert res["tokens"] == [["the", "plot", "was", "great"], ["an", "awful", "film"]]
    a = res["attributions"]
    assert int(np.argmax(a[0])) == 3 and a[0][3] > 0
    assert int(np.argmin(a[1][:3])) == 1 and a[1][1] < 0
    assert res["attributed_layer"] == "embedding"


def test_unknown_characters_are_tokens_and_a_text_of_punctuation_is_422(server: Server) -> None:
    """Unknown characters keep their spelling in ``tokens`` (``ñ`` and the emoji were dropped
    silently); a text in which the tokenizer finds nothing is refused as an empty one is
    (``"!!! ..."`` answered 200 with no tokens and [[0.0]]), naming the text."""
    with server.client() as c:
        body = {"method": "saliency", "inputs": ["great 🎬 film ñ"], "target": "positive"}
        res = ok(post(c, "text-classifier", body))
        assert res["tokens"] == [["great", "🎬", "film", "ñ"]]
        assert np.asarray(res["attributions"]).shape == (1, 4)
        for texts, bad in (
            (["!!! ..."], 0),
            (["a fine film", "!!! ..."], 1),
            (["ok", "?!", "ok"], 1),
        ):
            r = post(c, "text-classifier", {"method": "saliency", "inputs": texts, "target": 0})
            assert r.status_code == 422, r.text
            assert r.json()["errors"][0]["loc"] == ["body", "inputs", bad], r.json()
            assert "no word" in r.json()["detail"]


def test_numbers_equal_engine_and_captum(server: Server) -> None:
    """The HTTP layer adds nothing: IG equals the engine in-process and Captum."""
    from captum.attr import IntegratedGradients

    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    model = model_registry.load(spec).model
    x = torch.tensor(TAB_X)
    with server.client() as c:
        res = ok(
            post(
                c,
                "tabular-mlp",
                {
                    "method": "integrated_gradients",
                    "inputs": TAB_X,
                    "target": [2, 0],
                    "return_convergence_delta": True,
                },
            )
        )
    ours = methods.attribute(model, x, "integrated_gradients", target=[2, 0])
    np.testing.assert_allclose(res["attributions"], ours.attributions.numpy(), rtol=1e-5, atol=1e-6)
    theirs = IntegratedGradients(model).attribute(x, target=[2, 0], method="gausslegendre")
    np.testing.assert_allclose(res["attributions"], theirs.detach().numpy(), rtol=1e-4, atol=1e-5)
    assert res["outputs"] == pytest.approx(model(x)[[0, 1], [2, 0]].tolist(), rel=1e-5)


@pytest.mark.parametrize(
    ("method", "extra"),
    [("layer_integrated_gradients", {"return_convergence_delta": True}),
     ("layer_lrp", {"return_convergence_delta": True}), ("layer_activation", {})],
)  # fmt: skip
def test_a_list_of_layers_answers_one_entry_per_layer(
    server: Server, method: str, extra: dict[str, Any]
) -> None:
    """CONTRACT §7.7: params.layer may be a list; attributions (and deltas) are lists per layer,
    each the engine's answer for that layer alone, merged requests included."""
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    model = model_registry.load(spec).model
    layers = ["fc2", "fc1"]
    body = {"method": method, "inputs": TAB_X, "target": [2, 0], "params": {"layer": layers},
            **extra}  # fmt: skip
    with server.client() as c:
        res = ok(post(c, "tabular-mlp", body))
        res_b64 = ok(post(c, "tabular-mlp", {**body, "output_encoding": "base64"}))
    assert len(res["attributions"]) == len(res_b64["attributions"]) == 2
    for i, layer in enumerate(layers):
        alone = methods.attribute(
            model, torch.tensor(TAB_X), method, target=[2, 0], layer=layer,
            **({"return_convergence_delta": True} if extra else {}),
        )  # fmt: skip
        want = alone.attributions.numpy()
        np.testing.assert_allclose(res["attributions"][i], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(from_b64(res_b64["attributions"][i]), want, rtol=1e-5, atol=1e-6)
        if extra:
            np.testing.assert_allclose(
                res["convergence_delta"][i], alone.convergence_delta.numpy(), rtol=1e-4, atol=1e-5
            )
    assert res["params"]["layer"] == layers


def test_inputs_by_name_and_torchscript(server: Server) -> None:
    with server.client() as c:
        res = ok(
            post(
                c,
                "two-input",
                {
                    "method": "integrated_gradients",
                    "target": "second",
                    "inputs": {"b": [[4.0, 5.0]], "a": [[1.0, 2.0, 3.0]]},
                    "return_convergence_delta": True,
                },
            )
        )
        a, b = res["attributions"]
        np.testing.assert_allclose(a, [[1.0, 0, 0]], atol=1e-5)
        np.testing.assert_allclose(b, [[0, -5.0]], atol=1e-5)
        ok(post(c, "scripted", {"method": "saliency", "inputs": [[1, 2, 3, 4]], "target": 1}))
        r = post(c, "scripted", {"method": "deeplift", "inputs": [[1, 2, 3, 4]], "target": 1})
        assert r.status_code == 422 and "TorchScript" in r.json()["detail"]


@pytest.mark.parametrize(
    ("model", "body", "status"),
    [
        ("nope", {"method": "saliency", "inputs": TAB_X, "target": 0}, 404),
        ("tabular-mlp", {"method": "nope", "inputs": TAB_X, "target": 0}, 404),
        ("tabular-mlp", {"method": "saliency", "inputs": TAB_X, "target": 5}, 422),
        ("tabular-mlp", {"method": "saliency", "inputs": [[0.0] * 5], "target": 0}, 422),
        (
            "tabular-mlp",
            {"method": "saliency", "inputs": TAB_X, "target": 0, "params": {"bogus": 1}},
            422,
        ),
        (
            "tabular-mlp",
            {
                "method": "integrated_gradients",
                "inputs": TAB_X,
                "target": 0,
                "params": {"n_steps": 100_000},
            },
            422,
        ),
        ("image-cnn", {"method": "saliency", "inputs": [[[[0.0]]]], "target": 0}, 422),
    ],
)
def test_errors(server: Server, model: str, body: dict[str, Any], status: int) -> None:
    with server.client() as c:
        r = post(c, model, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["loc"][0] in ("body", "path")


def test_malformed_and_oversized(server: Server) -> None:
    with server.client() as c:
        r = c.post(
            "/v1/models/tabular-mlp/attributions",
            content=b"{oops",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400
        big = b'{"method": "saliency", "inputs": [' + b"[0.5, 0.5, 0.5, 0.5]," * 2_000_000
        r = c.post(
            "/v1/models/tabular-mlp/attributions",
            content=big + b"[0]]}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413


def _metric(text: str, name: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + " ") or line.startswith(name + "{")
    )


def test_concurrent_requests_merge_and_match_one_by_one(server: Server) -> None:
    rng = np.random.default_rng(1)
    xs = [rng.normal(size=(1 + i % 3, 8)).astype(np.float32).tolist() for i in range(10)]
    # mixed target forms merge too: an int for all, or one per example
    bodies = [
        {
            "method": "integrated_gradients",
            "inputs": x,
            "target": (i % 3 if i % 2 else [i % 3] * len(x)),
            "params": {"n_steps": 20},
            "return_convergence_delta": True,
        }
        for i, x in enumerate(xs)
    ]
    with server.client() as c:
        before = _metric(c.get("/metrics").text, "attrserve_merged_requests_total")
        one_by_one = [ok(post(c, "tabular-mlp", b)) for b in bodies]

    async def burst() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as ac:
            rs = await asyncio.gather(
                *(ac.post("/v1/models/tabular-mlp/attributions", json=b) for b in bodies)
            )
        return [ok(r) for r in rs]

    together = asyncio.run(burst())
    assert max(r["merged_requests"] for r in together) > 1
    for a, b in zip(one_by_one, together, strict=True):
        assert a["merged_requests"] == 1
        np.testing.assert_allclose(a["attributions"], b["attributions"], rtol=1e-5, atol=1e-6)
        # float32 sums over batches of other sizes: 1.1e-5 of 0.23 apart on an AVX-512 CPU
        np.testing.assert_allclose(a["convergence_delta"], b["convergence_delta"], rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(a["outputs"], b["outputs"], rtol=1e-5, atol=1e-7)
        assert a["target"] == b["target"]
    with server.client() as c:
        text = c.get("/metrics").text
    assert _metric(text, "attrserve_merged_requests_total") > before
    assert 'attrserve_batch_requests_bucket{le="1.0"}' in text
    assert _metric(text, "attrserve_batch_requests_count") > _metric(
        text, 'attrserve_batch_requests_bucket{le="1.0"}'
    )
    assert (
        'attrserve_requests_total{method="integrated_gradients",model="tabular-mlp",'
        'operation="attributions",status="200"}' in text
    )
    assert "attrserve_request_latency_seconds_bucket" in text and "attrserve_queue_depth" in text


def slow_body() -> dict[str, Any]:
    """About 3 s whatever the machine: 60 forwards of a model that sleeps 50 ms in each."""
    return {
        "method": "integrated_gradients",
        "inputs": [[1.0, 2.0]],
        "target": 0,
        "params": {"n_steps": 60},
        "internal_batch_size": 1,
    }


def _in_thread(fn: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


KEY = {"X-API-Key": "k-tight"}


def test_tight_api_keys(tight_server: Server) -> None:
    with tight_server.client() as c:
        assert c.get("/v1/health/ready").status_code == 200
        assert c.get("/metrics").status_code == 200
        r = post(c, "tabular-mlp", {"method": "saliency", "inputs": TAB_X, "target": 0})
        assert r.status_code == 401
        r = post(
            c, "text-classifier", {"method": "saliency", "inputs": ["x"], "target": 0}, headers=KEY
        )
        assert r.status_code == 403
        ok(
            post(
                c, "tabular-mlp", {"method": "saliency", "inputs": TAB_X, "target": 0}, headers=KEY
            )
        )


def slow_worker(server: Server) -> dict[str, Any]:
    """The worker of the "slow" model's group (each model has its own)."""
    workers: list[dict[str, Any]] = server.ready()["workers"]  # type: ignore[assignment]
    (worker,) = [w for w in workers if w["group"] == "slow"]
    return worker


def test_tight_queue_full_is_429(tight_server: Server) -> None:
    with tight_server.client(headers=KEY) as c:
        t, out = _in_thread(lambda: post(c, "slow", slow_body()))
        time.sleep(0.5)  # the slow request holds its group's only worker
        quick = {"method": "saliency", "inputs": [[0.5, -0.5]], "target": 0}
        t2, out2 = _in_thread(lambda: post(c, "slow", quick))  # fills the group's queue
        time.sleep(0.2)
        r = post(c, "slow", quick)
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        # another model's group has its own queue
        ok(post(c, "tabular-mlp", {"method": "saliency", "inputs": TAB_X, "target": 0}))
        t.join(60)
        t2.join(60)
        assert out[0].status_code == 200 and out2[0].status_code == 200


def test_tight_deadline_is_504_and_worker_survives(tight_server: Server) -> None:
    with tight_server.client(headers=KEY) as c:
        pid = slow_worker(tight_server)["pid"]
        r = post(c, "slow", slow_body(), headers={"X-Deadline-Ms": "300"})
        assert r.status_code == 504, r.text
        ok(post(c, "slow", {"method": "saliency", "inputs": [[0.5, -0.5]], "target": 0}))
        assert slow_worker(tight_server)["pid"] == pid


def test_tight_killed_worker_is_503_then_recovers(tight_server: Server) -> None:
    with tight_server.client(headers=KEY) as c:
        pid = slow_worker(tight_server)["pid"]
        t, out = _in_thread(lambda: post(c, "slow", slow_body()))
        time.sleep(1.0)  # mid-request
        os.kill(int(pid), signal.SIGKILL)
        t.join(60)
        assert out[0].status_code == 503, out[0].text
        assert out[0].json()["type"].endswith("worker_lost")
        assert "'slow'" in out[0].json()["detail"]
        # the model is served again once its group's worker is back
        tight_server.wait_ready()
        ok(post(c, "slow", {"method": "saliency", "inputs": [[0.5, -0.5]], "target": 0}))
        status = slow_worker(tight_server)
        assert status["pid"] != pid
        assert status["restarts"] == 1
        assert _metric(c.get("/metrics").text, "attrserve_worker_restarts_total") == 1
