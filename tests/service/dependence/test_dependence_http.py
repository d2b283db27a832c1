"""``POST /v1/models/{id}/dependence`` (CONTRACT §9.6): tabular-mlp's partial dependence and ICE
curves equal scikit-learn's ``partial_dependence(method="brute")`` on the served model's
probabilities; pictures; the job route; refusals naming their field."""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.inspection import partial_dependence

import model_registry
from tests.service.conftest import Server

ROWS = np.random.default_rng(2).normal(size=(30, 8)).round(3)


class Served(ClassifierMixin, BaseEstimator):
    """tabular-mlp as scikit-learn calls a classifier (its softmax)."""

    def __init__(self, model: Any = None) -> None:
        self.model = model

    def fit(self, X: Any, y: Any) -> Served:
        self.classes_ = np.arange(3)
        return self

    def predict_proba(self, X: Any) -> Any:
        with torch.no_grad():
            return torch.softmax(self.model(torch.tensor(X, dtype=torch.float32)), -1).numpy()


def served_model() -> torch.nn.Module:
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    model: torch.nn.Module = model_registry.load(spec).model.eval()
    return model


def post(server: Server, body: dict[str, Any], model: str = "tabular-mlp") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/dependence", json=body, timeout=60)


def test_the_curves_are_scikit_learns(server: Server) -> None:
    body = {"inputs": ROWS.tolist(), "features": [0, 3], "target": "high", "kind": "both",
            "output": "probability", "grid_resolution": 12, "render": True}  # fmt: skip
    r = post(server, body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["target"] == 2 and got["output"] == "probability"
    est = Served(served_model()).fit(ROWS, None)
    x = ROWS.astype(np.float32)
    for curve in got["features"]:
        f = curve["feature"]
        want = partial_dependence(est, x, [f], method="brute", kind="both", grid_resolution=12)
        np.testing.assert_allclose(curve["grid"], want["grid_values"][0], rtol=1e-6)
        np.testing.assert_allclose(curve["average"], want["average"][2], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(curve["individual"], want["individual"][2], rtol=1e-5,
                                   atol=1e-7)  # fmt: skip
    assert [p["feature"] for p in got["renders"]] == [0, 3]
    picture = Image.open(io.BytesIO(base64.b64decode(got["renders"][0]["b64"])))
    assert picture.size == (480, 320)


def test_a_dependence_job(server: Server) -> None:
    body = {"inputs": ROWS.tolist(), "features": [1], "target": 0}
    sync = post(server, body).json()
    r = httpx.post(f"{server.url}/v1/models/tabular-mlp/dependence-jobs", json=body, timeout=30)
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    for _ in range(600):
        if httpx.get(f"{server.url}/v1/jobs/{job_id}", timeout=30).json()["status"] == "succeeded":
            break
        time.sleep(0.05)
    result = httpx.get(f"{server.url}/v1/jobs/{job_id}/result", timeout=30).json()
    assert result["features"] == sync["features"]


@pytest.mark.parametrize(
    ("model", "body", "loc", "words"),
    [
        ("tabular-mlp", {"features": [8], "target": 0}, ["body", "features", 0], ["0..7"]),
        ("tabular-mlp", {"features": [0]}, ["body", "target"], ["required"]),
        ("tabular-mlp", {"features": [0], "target": "predicted"}, ["body", "target"],
         ["one output"]),
        ("tabular-mlp", {"features": [0], "target": 0, "percentiles": [0.9, 0.1]},
         ["body", "percentiles"], ["low < high"]),
        ("tabular-mlp", {"features": [0], "target": 0, "grid_resolution": 1},
         ["body", "grid_resolution"], []),
        ("image-cnn", {"features": [0], "target": 0}, ["path", "model_id"], ["tabular"]),
        ("text-classifier", {"features": [0], "target": 0}, ["path", "model_id"], ["tabular"]),
    ],
)  # fmt: skip
def test_refusals_name_their_field(
    server: Server, model: str, body: dict[str, Any], loc: list[Any], words: list[str]
) -> None:
    inputs = ["fine"] if model == "text-classifier" else ROWS[:4].tolist()
    if model == "image-cnn":
        inputs = np.zeros((1, 3, 32, 32)).tolist()
    r = post(server, {"inputs": inputs, **body}, model)
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["errors"][0]["loc"] == loc, problem
    for w in words:
        assert w in problem["detail"], problem["detail"]
