"""Shapley values over HTTP as shap users know them (CONTRACT §9.3): a background set in the
body, base_values in the answer, the scale attributed (output) and {"top_k": K}; each equal to
the engine's answer on the same model (tests/methods/test_shap_background.py checks the
engine against shap 0.51.0), as a job too, and every bad value a 422 naming its field."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import methods
import model_registry
from tests.service.conftest import Server, serve_in_thread, stop_server

X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [0.8, 0.1, 0.6, 0.3, 0.0, 0.9, 0.2, 0.4]]
BACKGROUND = [[0.0] * 8, [0.5] * 8, [1.0, 0.0] * 4]


def model() -> Any:
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    return model_registry.load(spec).model


def post(c: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    return c.post("/v1/models/tabular-mlp/attributions", json=body)


def job_result(c: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as an attribution job on tabular-mlp, waited for: its result."""
    job = c.post("/v1/models/tabular-mlp/attribution-jobs", json=body)
    assert job.status_code == 202, job.text
    jid = job.json()["id"]
    for _ in range(600):
        info = c.get(f"/v1/jobs/{jid}").json()
        if info["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.05)
    assert info["status"] == "succeeded", info.get("error")
    return dict(c.get(f"/v1/jobs/{jid}/result").json())


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
        result = job_result(c, body)
    best = model()(torch.tensor(X)).argsort(1, descending=True)[:, :2].tolist()
    assert got["target"] == best == result["target"]
    assert np.asarray(got["attributions"]).shape == (2, 2, 8)
    assert np.asarray(got["base_values"]).shape == np.asarray(got["outputs"]).shape == (2, 2)
    np.testing.assert_allclose(result["attributions"], got["attributions"], atol=1e-6)
    with server.client() as c:
        sampled = post(c, {**body, "method": "shapley_value_sampling", "params": {}}).json()
    assert np.asarray(sampled["standard_error"]).shape == (2, 2, 8)
    assert np.asarray(got["standard_error"]).shape == (2, 2, 8)  # kernel_shap's: bootstrap
    assert np.all(np.asarray(got["standard_error"]) >= 0)
    with server.client() as c:  # an exact answer (every coalition enumerated) has none
        exact = post(c, {**body, "method": "partition", "params": {}}).json()
    assert "standard_error" not in exact


def test_partition_over_a_background_is_the_engines_answer_as_a_job_too(server: Server) -> None:
    body = {
        "method": "partition",
        "inputs": X,
        "target": 2,
        "baselines": {"background": BACKGROUND},
        "params": {"max_evals": 30},
        "output": "log_odds",
    }
    with server.client() as c:
        r = post(c, body)
        assert r.status_code == 200, r.text
        done = job_result(c, body)
    got = r.json()
    ours = methods.attribute(
        model(), torch.tensor(X), "partition", target=2, max_evals=30, output="log_odds",
        baselines=methods.Background(torch.tensor(BACKGROUND)),
    )  # fmt: skip
    np.testing.assert_allclose(got["attributions"], ours.attributions.numpy(), atol=1e-6)
    np.testing.assert_allclose(got["base_values"], ours.base_values.numpy(), atol=1e-6)
    np.testing.assert_allclose(done["attributions"], got["attributions"], atol=1e-6)
    total = np.asarray(got["attributions"]).sum(1) + np.asarray(got["base_values"])
    np.testing.assert_allclose(total, got["outputs"], atol=1e-5)


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
        ({"method": "partition", "params": {"clustering": [[0, 1, 1.0, 2]]}},
         ["body", "params", "clustering"]),
        ({"method": "partition", "params": {"clustering": "correlation"}},
         ["body", "params", "clustering"]),
        ({"method": "partition", "params": {"image_masker": "blur(3,3)"}},
         ["body", "params", "image_masker"]),
        ({"method": "partition", "params": {"max_evals": 2}}, ["body", "params", "max_evals"]),
        ({"method": "kernel_shap", "params": {"n_samples": "auto", "tolerance": 0}},
         ["body", "params", "tolerance"]),
        ({"method": "shapley_value_sampling", "params": {"n_samples": "many"}},
         ["body", "params", "n_samples"]),
    ]  # fmt: skip
    with server.client() as c:
        for change, loc in cases:
            r = post(c, {**base, **change})
            assert r.status_code == 422, (change, r.text)
            errors = r.json().get("errors") or [r.json()]
            locs = [e.get("loc") for e in errors]
            assert loc in locs or any(loc == (x or [])[: len(loc)] for x in locs), (change, locs)


def test_a_models_background_is_the_shapley_default_and_bad_files_are_refused(
    tmp_path: Path,
) -> None:
    """models.toml background (a .npy of rows) summarised by background_kmeans: the Shapley
    methods' baselines when a request names none (the engine's answer over methods.kmeans of
    the same rows), other methods' defaults unchanged; a file that does not fit is refused
    when the models file is read, naming the field."""
    rows = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    np.save(tmp_path / "bg.npy", rows)
    np.save(tmp_path / "wrong.npy", rows[:, :7])
    toml = (
        '[[models]]\nid = "tabular-mlp"\nsource = "builtin:tabular-mlp"\n'
        'background = "bg.npy"\nbackground_kmeans = 4\n'
    )
    server = serve_in_thread(tmp_path, toml=toml, every_model=False)
    try:
        with server.client() as c:
            shapley = post(c, {"method": "shapley_values", "inputs": X, "target": 1}).json()
            ig = post(c, {"method": "integrated_gradients", "inputs": X, "target": 1}).json()
    finally:
        stop_server(server)
    summary = methods.kmeans(torch.from_numpy(rows).double(), 4)
    bg = methods.Background(summary.rows.float(), summary.weights)  # type: ignore[union-attr]
    ours = methods.attribute(model(), torch.tensor(X), "shapley_values", target=1, baselines=bg)
    np.testing.assert_allclose(shapley["attributions"], ours.attributions.numpy(), atol=1e-5)
    np.testing.assert_allclose(shapley["base_values"], ours.base_values.numpy(), atol=1e-5)
    plain = methods.attribute(model(), torch.tensor(X), "integrated_gradients", target=1)
    np.testing.assert_allclose(ig["attributions"], plain.attributions.numpy(), atol=1e-5)
    for extra, words in [
        ('background = "wrong.npy"', "do not fit"),
        ('background = "none.npy"', "not found"),
        ("background_kmeans = 3", "add background"),
        ('background = "bg.npy"\nbackground_kmeans = 0', "positive integer"),
    ]:
        (tmp_path / "bad.toml").write_text(
            f'[[models]]\nid = "t"\nsource = "builtin:tabular-mlp"\n{extra}\n'
        )
        with pytest.raises(model_registry.RegistryError, match=words):
            model_registry.load_specs(str(tmp_path / "bad.toml"))


def test_a_waterfall_goes_from_the_base_value_to_the_output(server: Server) -> None:
    import base64

    body = {
        "method": "shapley_values",
        "inputs": X,
        "target": 1,
        "baselines": {"background": BACKGROUND},
        "render": {"kind": "waterfall", "format": "html"},
    }
    with server.client() as c:
        r = post(c, body)
        assert r.status_code == 200, r.text
        got = r.json()
        (first, _) = got["renders"]
        page = base64.b64decode(first["b64"]).decode()
        assert "E[f(X)]" in page and page.count("<tr>") == 8  # one row per feature
        values = np.asarray(got["attributions"][0])
        biggest = int(np.argmax(np.abs(values)))
        first_value = page.split("<td class=num>")[1].split("</td>")[0]
        assert float(first_value) == pytest.approx(values[biggest], rel=1e-2)  # largest on top
        png = post(c, {**body, "render": {"kind": "waterfall"}})
        assert png.status_code == 200, png.text
        assert base64.b64decode(png.json()["renders"][0]["b64"]).startswith(b"\x89PNG")
        # no base value to start from, or no features to stack: a 422 naming render.kind
        for bad in ({"method": "saliency"}, {"target": {"top_k": 2}}):
            r = post(c, {**body, **bad, "baselines": None} if "method" in bad else {**body, **bad})
            assert r.status_code == 422, r.text
            assert ["body", "render", "kind"] in [e.get("loc") for e in r.json()["errors"]]


def test_auto_samples_answer_what_they_took(server: Server) -> None:
    body = {
        "method": "shapley_value_sampling",
        "inputs": X,
        "target": 1,
        "params": {"n_samples": "auto", "tolerance": 0.1},
        "seed": 3,
    }
    with server.client() as c:
        r = post(c, body)
        assert r.status_code == 200, r.text
        got = r.json()
        fixed = post(c, {**body, "params": {"n_samples": 25}}).json()
    samples = got["samples"]
    assert samples["n_samples"] >= 16 and samples["evaluations"] == samples["n_samples"] * 9
    se, attr = np.asarray(got["standard_error"]), np.asarray(got["attributions"])
    assert np.all(se.max(1) <= 0.1 * np.abs(attr).max(1) + 1e-9)
    assert "samples" not in fixed


def test_auto_samples_count_against_the_servers_sample_limit(tmp_path: Path) -> None:
    srv = serve_in_thread(tmp_path, max_n_samples=100)
    try:
        with srv.client() as c:
            body = {"method": "kernel_shap", "inputs": X, "target": 0,
                    "params": {"n_samples": "auto"}}  # fmt: skip
            r = post(c, body)
    finally:
        stop_server(srv)
    assert r.status_code == 422, r.text
    assert "up to 1024 samples" in r.text
    assert ["body", "params", "n_samples"] in [e.get("loc") for e in r.json()["errors"]]
