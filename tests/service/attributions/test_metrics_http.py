"""Explanation metrics on the attributions route (CONTRACT 7.3): the response's ``metrics`` equal
``methods.evaluate`` on the same model, inputs, attributions, target and seed; seeded and
repeatable; token models get the curves over their tokens; what cannot be scored is refused
with a 422 at the field; sensitivity_max counts in the request's cost."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import pytest
import torch

import methods
from model_registry.builtin import build
from tests.service.conftest import Server

TAB = np.array(
    [[1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0], [-1.2, 0.5, 0.3, -0.8, 0.2, 0.1, -0.3, 0.6]],
    dtype=np.float32,
)
ALL: dict[str, Any] = {
    "infidelity": {},
    "sensitivity_max": {"n_perturb_samples": 4},
    "deletion": {"steps": 8},
    "insertion": {},
}


def post(server: Server, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60)


def ok(server: Server, model: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(server, model, body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def expected(model: str, x: torch.Tensor, body: dict[str, Any], seed: int) -> dict[str, Any]:
    """``methods.evaluate`` here, on the built-in model and its attributions computed here."""
    net, _ = build(model)
    kw = {"target": body["target"], **body.get("params", {})}
    attrs = methods.attribute(net, x, body["method"], **kw).attributions
    return methods.evaluate(
        net,
        x,
        attrs,
        target=body["target"],
        metrics=body["metrics"],
        seed=seed,
        method=body["method"],
        method_params=body.get("params", {}),
    )


def close(got: dict[str, Any], want: dict[str, Any], rtol: float = 1e-4) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        if isinstance(value, dict):
            for key in ("auc", "curve"):
                np.testing.assert_allclose(got[name][key], value[key].numpy(), rtol=rtol, atol=1e-6)
        else:
            np.testing.assert_allclose(got[name], value.numpy(), rtol=rtol, atol=1e-6)


def test_every_metric_equals_methods_evaluate(server: Server) -> None:
    body = {
        "method": "integrated_gradients",
        "inputs": TAB.tolist(),
        "target": 1,
        "params": {"n_steps": 16},
        "metrics": ALL,
    }
    got = ok(server, "tabular-mlp", body)
    close(got["metrics"], expected("tabular-mlp", torch.from_numpy(TAB), body, seed=0))
    assert len(got["metrics"]["deletion"]["curve"][0]) == 9
    assert len(got["metrics"]["insertion"]["curve"][0]) == 21
    assert 0 < got["timing_ms"]["metrics"] <= got["timing_ms"]["compute"]
    # the attributions themselves are the request's without metrics
    plain = ok(server, "tabular-mlp", {k: v for k, v in body.items() if k != "metrics"})
    np.testing.assert_allclose(got["attributions"], plain["attributions"], rtol=1e-6)
    assert "metrics" not in plain or plain["metrics"] is None


def test_seeded_and_repeatable(server: Server) -> None:
    body = {
        "method": "saliency",
        "inputs": TAB.tolist(),
        "target": 0,
        "params": {"abs": False},
        "metrics": {"infidelity": {"noise_std": 0.1}},
    }
    first = ok(server, "tabular-mlp", body)["metrics"]["infidelity"]
    assert ok(server, "tabular-mlp", body)["metrics"]["infidelity"] == first
    seeded = ok(server, "tabular-mlp", {**body, "seed": 7})["metrics"]["infidelity"]
    assert seeded != first
    close(
        {"infidelity": seeded},
        expected("tabular-mlp", torch.from_numpy(TAB), {**body, "seed": 7}, seed=7),
    )


def test_image_curves_by_feature_mask_groups(server: Server) -> None:
    from model_registry.builtin import image

    x, _ = image.make_data(2, torch.Generator().manual_seed(5))
    mask = (torch.arange(32)[:, None] // 8 * 4 + torch.arange(32)[None, :] // 8).expand(3, 32, 32)
    body = {
        "method": "feature_ablation",
        "inputs": x.tolist(),
        "target": 0,
        "params": {"feature_mask": mask.tolist()},
        "metrics": {"deletion": {"steps": 16}, "insertion": {"steps": 4}},
    }
    got = ok(server, "image-cnn", body)
    net, _ = build("image-cnn")
    # feature_mask: 16 groups ranked by their attribution sums, one group per step
    want = methods.evaluate(
        net,
        x,
        torch.tensor(got["attributions"]),
        target=0,
        metrics=body["metrics"],
        feature_mask=mask,
    )
    close(got["metrics"], want)
    # step 0 of deletion is the input itself: the targeted output
    np.testing.assert_allclose(
        [c[0] for c in got["metrics"]["deletion"]["curve"]], got["outputs"], rtol=1e-5
    )


def test_token_model_curves_over_tokens(server: Server) -> None:
    body = {
        "method": "integrated_gradients",
        "inputs": ["a wonderful film", "a dull plot"],
        "target": "positive",
        "metrics": {"deletion": {"steps": 4}, "insertion": {"steps": 4}},
    }
    got = ok(server, "text-classifier", body)
    curve = np.array(got["metrics"]["deletion"]["curve"])
    assert curve.shape == (2, 5)
    np.testing.assert_allclose(curve[:, 0], got["outputs"], rtol=1e-5)
    insertion = np.array(got["metrics"]["insertion"]["curve"])
    np.testing.assert_allclose(insertion[:, -1], got["outputs"], rtol=1e-5)
    np.testing.assert_allclose(curve[:, -1], insertion[:, 0], rtol=1e-5)  # all baseline tokens
    r = post(server, "text-classifier", {**body, "metrics": {"infidelity": {}}})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["body", "metrics", "infidelity"]
    assert "token ids" in r.json()["detail"]


@pytest.mark.parametrize(
    ("method", "params", "metrics", "loc", "words"),
    [
        ("saliency", {}, {"fidelity": {}}, ["body", "metrics", "fidelity"], "unknown field"),
        (
            "saliency",
            {},
            {"deletion": {"steps": 0}},
            ["body", "metrics", "deletion", "steps"],
            "greater than or equal",
        ),
        (
            "saliency",
            {},
            {"infidelity": {"noise": 1}},
            ["body", "metrics", "infidelity", "noise"],
            "unknown field",
        ),
        (
            "layer_integrated_gradients",
            {"layer": "fc1"},
            {"deletion": {}},
            ["body", "metrics"],
            "layer",
        ),
        (
            "integrated_gradients",
            {"n_steps": 50},
            {"sensitivity_max": {"n_perturb_samples": 100000}},
            ["body"],
            "forward rows",
        ),
    ],
)
def test_refusals_name_the_field(
    server: Server,
    method: str,
    params: dict[str, Any],
    metrics: dict[str, Any],
    loc: list[str],
    words: str,
) -> None:
    body = {"method": method, "inputs": TAB.tolist(), "target": 0, "params": params}
    r = post(server, "tabular-mlp", {**body, "metrics": metrics})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == loc
    assert words in r.json()["detail"]
    assert post(server, "tabular-mlp", body).status_code == 200  # without metrics: served


def test_distribution_of_baselines_fills_with_its_mean(server: Server) -> None:
    """gradient SHAP's baselines are a distribution: the curves fill with its mean row."""
    base = np.stack([np.full(8, 0.2), np.full(8, -0.4), np.full(8, 0.5)]).astype(np.float32)
    body = {
        "method": "gradient_shap",
        "inputs": TAB.tolist(),
        "target": 2,
        "baselines": base.tolist(),
        "seed": 3,
        "metrics": {"deletion": {"steps": 8}},
    }
    got = ok(server, "tabular-mlp", body)
    net, _ = build("tabular-mlp")
    want = methods.evaluate(
        net,
        torch.from_numpy(TAB),
        torch.tensor(got["attributions"]),
        target=2,
        metrics=body["metrics"],
        baselines=torch.from_numpy(base).mean(0, keepdim=True),
    )
    close(got["metrics"], want)


def test_jobs_refuse_metrics(server: Server) -> None:
    body = {"method": "saliency", "inputs": TAB.tolist(), "target": 0, "metrics": {"deletion": {}}}
    r = httpx.post(f"{server.url}/v1/models/tabular-mlp/attribution-jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["body", "metrics"]


def test_the_wire_defaults_are_the_engines() -> None:
    from methods.evaluation import METRICS
    from service.wire.attributions import MetricsRequest

    asked = MetricsRequest.model_validate({name: {} for name in METRICS}).asked()
    assert asked == {name: {k: d for k, (d, _) in p.items()} for name, p in METRICS.items()}
