"""``GET /v1/jobs/{id}/summary`` (CONTRACT §9.6): a finished attribution job's attributions
aggregated per label of its targets, checked against NumPy over the job's own result; token
models by token text; a bar chart; what cannot be summarised refused."""

from __future__ import annotations

import io
import time
from collections import defaultdict
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.service.conftest import Server

AGGS = {
    "mean_abs": lambda v: np.abs(v).mean(axis=0),
    "mean": lambda v: v.mean(axis=0),
    "median": lambda v: np.median(v, axis=0),
    "mean_sq": lambda v: np.square(v).mean(axis=0),
    "std": lambda v: v.std(axis=0),
}
LABELS = ["low", "mid", "high"]  # tabular-mlp's classes


def job(server: Server, model: str, body: dict[str, Any]) -> str:
    r = httpx.post(f"{server.url}/v1/models/{model}/attribution-jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job_id: str = r.json()["id"]
    for _ in range(1200):
        info = httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()
        if info["status"] in ("succeeded", "failed", "cancelled"):
            assert info["status"] == "succeeded", info
            return job_id
        time.sleep(0.05)
    raise TimeoutError(job_id)


def get(server: Server, job_id: str, **query: Any) -> httpx.Response:
    return httpx.get(f"{server.url}/v1/jobs/{job_id}/summary", params=query, timeout=30)


def test_a_tabular_job_is_summarised_per_predicted_label(server: Server) -> None:
    rows = np.random.default_rng(0).normal(size=(60, 8)).round(3).tolist()
    body = {"method": "integrated_gradients", "inputs": rows, "target": "predicted",
            "params": {"n_steps": 16}}  # fmt: skip
    job_id = job(server, "tabular-mlp", body)
    result = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", timeout=30).json()
    attrs, targets = np.array(result["attributions"]), result["target"]
    names = httpx.get(f"{server.url}/v1/models/tabular-mlp", timeout=30).json()["inputs"][0]
    for agg, fn in AGGS.items():
        r = get(server, job_id, agg=agg)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["examples"] == 60 and got["agg"] == agg and got["model_id"] == "tabular-mlp"
        assert sum(part["examples"] for part in got["labels"].values()) == 60
        for label, part in got["labels"].items():
            mine = attrs[[i for i, t in enumerate(targets) if LABELS[t] == label]]
            want = fn(mine)
            np.testing.assert_allclose(part["values"], want, rtol=1e-6, atol=1e-9)  # float32
            assert part["ranking"] == np.argsort(-want, kind="stable").tolist()
            assert len(part["features"]) == 8
            if names.get("features"):
                assert part["features"] == names["features"]
    assert get(server, job_id).json()["agg"] == "mean_abs"  # the default
    png = get(server, job_id, format="png")
    assert png.status_code == 200 and png.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(png.content)).size[0] == 640
    refused = get(server, job_id, format="png", label="sideways")
    assert refused.status_code == 422 and refused.json()["errors"][0]["loc"] == ["query", "label"]


def test_a_token_models_job_is_summarised_by_token_text(server: Server) -> None:
    texts = ["a great film", "an awful film", "great great acting", "awful plot"] * 3
    job_id = job(server, "text-classifier", {"method": "feature_ablation", "inputs": texts,
                                             "target": "positive"})  # fmt: skip
    result = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", timeout=30).json()
    seen: dict[str, list[float]] = defaultdict(list)
    for row, tokens in zip(result["attributions"], result["tokens"], strict=True):
        for value, token in zip(row, tokens, strict=False):
            seen[token].append(value)
    got = get(server, job_id, agg="mean").json()["labels"]["positive"]
    assert got["examples"] == 12 and sorted(got["features"]) == sorted(seen)
    for token, value, count in zip(got["features"], got["values"], got["counts"], strict=True):
        assert count == len(seen[token])
        assert value == pytest.approx(np.mean(seen[token]), rel=1e-6, abs=1e-9)
    mean = dict(zip(got["features"], got["values"], strict=True))
    assert mean["awful"] < 0  # the sentiment word lowers "positive" wherever it stands
    strongest = get(server, job_id).json()["labels"]["positive"]  # mean |attribution|
    assert strongest["features"][strongest["ranking"][0]] in ("great", "awful")


def test_what_cannot_be_summarised(server: Server) -> None:
    assert get(server, "no-such-job").status_code == 404
    slow = httpx.post(f"{server.url}/v1/models/slow/attribution-jobs", timeout=30,
                      json={"method": "feature_ablation", "inputs": [[0.1, 0.2]] * 40,
                            "target": 0})  # fmt: skip
    assert slow.status_code == 202, slow.text
    r = get(server, slow.json()["id"])
    assert r.status_code == 409 and "succeeded" in r.json()["detail"]
    httpx.delete(f"{server.url}/v1/jobs/{slow.json()['id']}", timeout=30)
    bad = get(server, "no-such-job", agg="max")
    assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["query", "agg"]
