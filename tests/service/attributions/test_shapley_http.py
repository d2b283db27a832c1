"""Shapley values over HTTP as shap users know them (CONTRACT §9.3): a background set in the
body, base_values in the answer, the scale attributed (output) and {"top_k": K}; each equal to
the engine's answer on the same model (tests/methods/test_shap_background.py checks the
engine against shap 0.51.0), as a job too, and every bad value a 422 naming its field."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np
import torch

import methods
import model_registry
from tests.service.conftest import Server

X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [0.8, 0.1, 0.6, 0.3, 0.0, 0.9, 0.2, 0.4]]
BACKGROUND = [[0.0] * 8, [0.5] * 8, [1.0, 0.0] * 4]


def model() -> Any:
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    return model_registry.load(spec).model


def post(c: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return c.post("/v1/models/tabular-mlp/attributions", json=body)


def test_a_background_set_is_the_engines_answer_with_base_values(server: Server) -> None:
    body = {
        "method": "shapley_values",
        "inputs": X,
        "target": 1,
        "baselines": {"background": BACKGROUND, "weights": [1, 2, 1]},
        "output": "probability",
    }
    with server.client() as c:
        r = post(c, body)
    assert r.status_code == 200, r.text
    got = r.json()
    bg = methods.Background(torch.tensor(BACKGROUND), torch.tensor([1.0, 2.0, 1.0]))
    ours = methods.attribute(
        model(), torch.tensor(X), "shapley_values", target=1, baselines=bg, output="probability"
    )
    np.testing.assert_allclose(got["attributions"], ours.attributions.numpy(), atol=1e-6)
    np.testing.assert_allclose(got["base_values"], ours.base_values.numpy(), atol=1e-6)
    probability = torch.softmax(model()(torch.tensor(X)), 1)[:, 1].detach().numpy()
    np.testing.assert_allclose(got["outputs"], probability, atol=1e-6)
    # efficiency: the attributions complete the base value to the output
    total = np.asarray(got["attributions"]).sum(1) + np.asarray(got["base_values"])
    np.testing.assert_allclose(total, probability, atol=1e-5)


def test_top_k_answers_each_examples_best_classes_as_a_job_too(server: Server) -> None:
    body = {
        "method": "kernel_shap",
        "inputs": X,
        "target": {"top_k": 2},
        "baselines": {"background": BACKGROUND},
        "params": {"n_samples": 256},
        "seed": 0,
    }
    with server.client() as c:
        r = post(c, body)
        assert r.status_code == 200, r.text
        got = r.json()
        job = c.post("/v1/models/tabular-mlp/attribution-jobs", json=body)
        assert job.status_code == 202, job.text
        jid = job.json()["id"]
        for _ in range(600):
            info = c.get(f"/v1/jobs/{jid}").json()
            if info["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.05)
        assert info["status"] == "succeeded", info
        result = c.get(f"/v1/jobs/{jid}/result").json()
    best = model()(torch.tensor(X)).argsort(1, descending=True)[:, :2].tolist()
    assert got["target"] == best == result["target"]
    assert np.asarray(got["attributions"]).shape == (2, 2, 8)
    assert np.asarray(got["base_values"]).shape == np.asarray(got["outputs"]).shape == (2, 2)
    np.testing.assert_allclose(result["attributions"], got["attributions"], atol=1e-6)


def test_bad_values_are_422_naming_the_field(server: Server) -> None:
    base = {"method": "shapley_values", "inputs": X, "target": 0}
    weights = ["body", "baselines", "weights"]
    cases = [
        ({"output": "logit"}, ["body", "output"]),
        ({"target": {"top_k": 0}}, ["body", "target", "top_k"]),
        ({"target": {"top_k": 99}}, ["body", "target", "top_k"]),
        ({"target": {"top_k": 2, "index": [1]}}, ["body", "target", "top_k"]),
        ({"baselines": {"background": [[0.0] * 7]}}, ["body", "baselines", "background"]),
        ({"baselines": {"background": BACKGROUND, "weights": [1]}}, weights),
        ({"baselines": {"background": BACKGROUND, "weights": [1, -1, 1]}}, weights),
        ({"baselines": {"background": BACKGROUND, "other": 1}}, ["body", "baselines"]),
        ({"method": "gradient_shap", "baselines": {"background": BACKGROUND, "weights": [1, 1, 1]}},
         weights),
    ]  # fmt: skip
    with server.client() as c:
        for change, loc in cases:
            r = post(c, {**base, **change})
            assert r.status_code == 422, (change, r.text)
            errors = r.json().get("errors") or [r.json()]
            locs = [e.get("loc") for e in errors]
            assert loc in locs or any(loc == (x or [])[: len(loc)] for x in locs), (change, locs)
