"""Attacks and counterfactuals over HTTP (CONTRACT 7.2): the answers equal ``methods.attack`` and
``methods.min_perturbation`` on the same model; pictures of the perturbation; bad requests
refused with a 422 at the field, before any work."""

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

import methods
from model_registry.builtin import build, image
from tests.service.conftest import Server

TAB = np.array(
    [[1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0], [-1.2, 0.5, 0.3, -0.8, 0.2, 0.1, -0.3, 0.6]],
    dtype=np.float32,
)


def post(server: Server, model: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/{route}", json=body, timeout=60)


def ok(server: Server, model: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(server, model, route, body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def predicted(model: str, x: torch.Tensor) -> torch.Tensor:
    net, _ = build(model)
    with torch.no_grad():
        return net(x).argmax(dim=1)


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("fgsm", {"epsilon": 0.5, "loss": "cross_entropy"}),
        ("pgd", {"radius": 0.6, "step_size": 0.2, "step_num": 5, "norm": "L2"}),
    ],
)
def test_attack_equals_methods_attack(server: Server, method: str, params: dict[str, Any]) -> None:
    got = ok(
        server,
        "tabular-mlp",
        "attacks",
        {"method": method, "inputs": TAB.tolist(), "params": params},
    )
    x = torch.from_numpy(TAB)
    net, _ = build("tabular-mlp")
    target = predicted("tabular-mlp", x)
    want = methods.attack(net, x, method, target=target, **params)
    np.testing.assert_allclose(got["perturbed"], want.perturbed.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["predictions"], want.predictions.numpy(), rtol=1e-5, atol=1e-6)
    assert got["flipped"] == want.flipped.tolist()
    assert got["zero_gradient"] == want.zero_gradient.tolist()
    assert got["target"] == target.tolist()
    assert got["predicted"] == want.predictions.argmax(1).tolist()
    assert got["method"] == method
    assert got["params"]["loss"] == params.get("loss", "nll")


#: README's PGD example: tabular-mlp's softmax rounds to exactly 1 on TAB[0] (float32)
README_PGD = {"radius": 0.5, "step_size": 0.1, "step_num": 10, "loss": "cross_entropy"}


def test_an_attack_that_could_not_move_says_so_and_margin_moves_it(server: Server) -> None:
    """README's example with cross_entropy: no step is taken, and the answer says why
    (``zero_gradient``) instead of passing for robust; the margin loss flips it."""
    body = {"method": "pgd", "inputs": TAB.tolist(), "params": README_PGD}
    stuck = ok(server, "tabular-mlp", "attacks", body)
    assert stuck["zero_gradient"][0] is True and stuck["flipped"][0] is False
    np.testing.assert_array_equal(np.asarray(stuck["perturbed"][0], np.float32), TAB[0])
    x = torch.from_numpy(TAB)
    net, _ = build("tabular-mlp")
    target = predicted("tabular-mlp", x)
    want = methods.attack(net, x, "pgd", target=target, **README_PGD)
    assert stuck["zero_gradient"] == want.zero_gradient.tolist()
    margin = {"radius": 1.0, "step_size": 0.2, "step_num": 10, "loss": "margin"}
    for method, params in (("pgd", margin), ("fgsm", {"epsilon": 1.0, "loss": "margin"})):
        moved = ok(server, "tabular-mlp", "attacks", {**body, "method": method, "params": params})
        assert moved["zero_gradient"] == [False, False]
        assert moved["flipped"][0] is True
        assert moved["params"]["loss"] == "margin"
        want = methods.attack(net, x, method, target=target, **params)
        np.testing.assert_allclose(moved["perturbed"], want.perturbed.numpy(), atol=1e-6)
        assert moved["flipped"] == want.flipped.tolist()
    # a counterfactual's FGSM search takes the margin too
    search = {"arg_min": 0, "arg_max": 2, "arg_step": 0.05, "loss": "margin"}
    found = ok(server, "tabular-mlp", "counterfactuals",
               {"perturbation": "fgsm", "inputs": TAB[:1].tolist(), "params": search})  # fmt: skip
    assert found["min_param"][0] is not None
    # documented in the schema of the answer (OpenAPI)
    schema = httpx.get(f"{server.url}/openapi.json").json()["components"]["schemas"]
    assert schema["AttackResponse"]["properties"]["zero_gradient"]["type"] == "array"
    assert "zero_gradient" in schema["AttackResponse"]["required"]


def test_an_attack_job_says_per_example_which_could_not_move(keyed_server: Server) -> None:
    """zero_gradient in a job's result: per example, joined over its chunks, as the route."""
    rng = np.random.default_rng(2)
    x = (rng.random((120, 8), dtype=np.float32) * 0.4 - 0.2).astype(np.float32)
    x[::7] = TAB[0]  # the saturated row, in every chunk
    body = {"method": "fgsm", "inputs": x.tolist(), "params": {"epsilon": 0.2,
            "loss": "cross_entropy"}}  # fmt: skip
    key = {"X-API-Key": "k-a"}
    with keyed_server.client() as c:
        r = c.post("/v1/models/tabular-mlp/attack-jobs", json=body, headers=key)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        for _ in range(600):
            info = c.get(f"/v1/jobs/{job}", headers=key).json()
            if info["status"] not in ("queued", "running"):
                break
            time.sleep(0.1)
        assert info["status"] == "succeeded", info
        assert info["progress"]["total"] == 120
        result = c.get(f"/v1/jobs/{job}/result", headers=key).json()
        sync = c.post("/v1/models/tabular-mlp/attacks", json=body, headers=key).json()
    assert result["zero_gradient"] == sync["zero_gradient"]
    assert len(result["zero_gradient"]) == 120
    saturated = [i for i, z in enumerate(result["zero_gradient"]) if z]
    assert set(range(0, 120, 7)) <= set(saturated) and len(saturated) < 120
    np.testing.assert_array_equal(np.asarray(result["perturbed"], np.float32)[::7], x[::7])


def test_image_pgd_within_its_ball_with_pictures(server: Server) -> None:
    x, _ = image.make_data(2, torch.Generator().manual_seed(3))
    params = {
        "radius": 0.05,
        "step_size": 0.02,
        "step_num": 4,
        "lower_bound": 0.0,
        "upper_bound": 1.0,
        "loss": "cross_entropy",
    }
    body = {"method": "pgd", "inputs": x.tolist(), "target": 1, "params": params}
    got = ok(server, "image-cnn", "attacks", {**body, "render": {"examples": [1]}})
    moved = np.array(got["perturbed"])
    assert moved.shape == (2, 3, 32, 32)
    assert np.abs(moved - x.numpy()).max() <= 0.05 + 1e-6
    assert moved.min() >= 0.0 and moved.max() <= 1.0
    net, _ = build("image-cnn")
    want = methods.attack(net, x, "pgd", target=1, **params)
    np.testing.assert_allclose(moved, want.perturbed.numpy(), atol=1e-5)
    shown = [(r["example"], r["picture"]) for r in got["renders"]]
    assert shown == [(1, "perturbed"), (1, "difference")]
    for r in got["renders"]:
        assert r["media_type"] == "image/png"
        pic = Image.open(io.BytesIO(base64.b64decode(r["b64"])))
        assert pic.format == "PNG" and pic.width == 480  # render.width's default
    # the attributions route's render fields (PNG): the change over the input, 200 px wide
    render = {"format": "png", "kind": "overlay", "sign": "absolute", "width": 200,
              "examples": [0]}  # fmt: skip
    drawn = ok(server, "image-cnn", "attacks", {**body, "render": render})["renders"]
    assert [r["picture"] for r in drawn] == ["perturbed", "difference"]
    for r in drawn:
        assert Image.open(io.BytesIO(base64.b64decode(r["b64"]))).width == 200
    assert drawn[1]["b64"] != got["renders"][1]["b64"]
    for wrong, loc in (({"format": "html"}, "format"), ({"width": 10}, "width")):
        r = post(server, "image-cnn", "attacks", {**body, "render": wrong})
        assert r.status_code == 422 and r.json()["errors"][0]["loc"][-1] == loc, r.text


def test_two_inputs_and_a_mask_per_input(server: Server) -> None:
    a = [[1.0, -2.0, 0.5], [0.2, 0.1, -0.3]]
    b = [[0.3, 0.1], [-0.5, 0.4]]
    body = {
        "method": "fgsm",
        "inputs": {"a": a, "b": b},
        "target": "second",
        "params": {"epsilon": 0.1, "mask": [[[1, 0, 1]], [[0, 0]]], "loss": "cross_entropy"},
        "render": {},
    }
    got = ok(server, "two-input", "attacks", body)
    moved_a, moved_b = (np.array(p) for p in got["perturbed"])
    np.testing.assert_array_equal(moved_b, b)  # masked out
    np.testing.assert_array_equal(moved_a[:, 1], np.array(a)[:, 1])
    assert not np.allclose(moved_a[:, 2], np.array(a)[:, 2])  # a0: a zero gradient
    assert got["target"] == [1, 1]
    assert {r["input"] for r in got["renders"]} == {"a", "b"}
    assert {r["picture"] for r in got["renders"]} == {"difference"}  # tabular rows: bars


def test_counterfactual_feature_ablation_equals_methods(server: Server) -> None:
    params = {"arg_min": 0, "arg_max": 9, "arg_step": 1}
    body = {"perturbation": "feature_ablation", "inputs": TAB.tolist(), "params": params}
    got = ok(server, "tabular-mlp", "counterfactuals", body)
    x = torch.from_numpy(TAB)
    net, _ = build("tabular-mlp")
    want = methods.min_perturbation(
        net, x, "feature_ablation", target=predicted("tabular-mlp", x), **params
    )
    assert got["min_param"] == want.min_param
    np.testing.assert_allclose(got["perturbed"], want.perturbed.numpy(), atol=1e-6)
    np.testing.assert_allclose(got["predictions"], want.predictions.numpy(), rtol=1e-5, atol=1e-6)
    assert got["perturbation"] == "feature_ablation"
    assert got["params"]["attribution_method"] == "saliency"


def test_counterfactual_noise_is_seeded_and_none_when_nothing_flips(server: Server) -> None:
    body = {
        "perturbation": "gaussian_noise",
        "inputs": TAB.tolist(),
        "params": {"arg_min": 0.0, "arg_max": 6.0, "arg_step": 0.1, "mode": "binary"},
        "seed": 4,
    }
    first = ok(server, "tabular-mlp", "counterfactuals", body)
    assert ok(server, "tabular-mlp", "counterfactuals", body)["min_param"] == first["min_param"]
    x = torch.from_numpy(TAB)
    net, _ = build("tabular-mlp")
    want = methods.min_perturbation(
        net, x, "gaussian_noise", target=predicted("tabular-mlp", x), seed=4, **body["params"]
    )
    assert first["min_param"] == pytest.approx(want.min_param)
    tiny = {**body, "params": {"arg_min": 0.0, "arg_max": 1e-6, "arg_step": 1e-7}}
    none = ok(server, "tabular-mlp", "counterfactuals", {**tiny, "render": {}})
    assert none["min_param"] == [None, None]
    np.testing.assert_array_equal(
        np.array(none["perturbed"], dtype=np.float32), TAB
    )  # unchanged where nothing flips


FGSM = {"method": "fgsm", "params": {"epsilon": 0.1}}
PGD = {"method": "pgd", "params": {"radius": 1, "step_size": 0.1, "step_num": 4}}
SEARCH = {"arg_min": 0, "arg_max": 4, "arg_step": 1}
REFUSED: list[tuple[str, str, dict[str, Any], int, list[Any]]] = [
    ("attacks", "fgsm needs epsilon", {"method": "fgsm"}, 422, ["params", "epsilon"]),
    (
        "attacks",
        "unknown param",
        {**FGSM, "params": {"epsilon": 1, "steps": 3}},
        422,
        ["params", "steps"],
    ),
    (
        "attacks",
        "a tensor param the attack has not",
        {**FGSM, "params": {"epsilon": 1, "baselines": 0.5}},
        422,
        ["params", "baselines"],
    ),
    (
        "attacks",
        "bad loss",
        {**FGSM, "params": {"epsilon": 1, "loss": "mse"}},
        422,
        ["params", "loss"],
    ),
    ("attacks", "unknown attack", {"method": "cw"}, 422, ["method"]),
    (
        "attacks",
        "no steps",
        {**PGD, "params": {**PGD["params"], "step_num": 0}},
        422,
        ["params", "step_num"],
    ),
    (
        "attacks",
        "steps over the limit",
        {**PGD, "params": {**PGD["params"], "step_num": 10**5}},
        422,
        ["params", "step_num"],
    ),
    (
        "attacks",
        "a mask of another shape",
        {**FGSM, "params": {"epsilon": 1, "mask": [[1, 0]]}},
        422,
        ["params", "mask"],
    ),
    (
        "attacks",
        "no such example",
        {**FGSM, "render": {"examples": [5]}},
        422,
        ["render", "examples", 0],
    ),
    (
        "counterfactuals",
        "no arg_step",
        {"perturbation": "fgsm", "params": {"arg_min": 0, "arg_max": 1}},
        422,
        ["params", "arg_step"],
    ),
    (
        "counterfactuals",
        "an empty range",
        {"perturbation": "fgsm", "params": {**SEARCH, "arg_step": 5}},
        422,
        ["params", "arg_max"],
    ),
    (
        "counterfactuals",
        "unknown method",
        {"perturbation": "feature_ablation", "params": {**SEARCH, "attribution_method": "salency"}},
        404,
        ["params", "attribution_method"],
    ),
    (
        "counterfactuals",
        "over the cost limit",
        {"perturbation": "gaussian_noise", "params": {**SEARCH, "arg_step": 1e-6}},
        422,
        [],
    ),
]


@pytest.mark.parametrize(("route", "why", "body", "status", "loc"), REFUSED)
def test_refusals_name_the_field(
    server: Server, route: str, why: str, body: dict[str, Any], status: int, loc: list[Any]
) -> None:
    r = post(server, "tabular-mlp", route, {"inputs": TAB.tolist(), **body})
    assert r.status_code == status, (why, r.text)
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == ["body", *loc], why


def test_token_models_are_refused(server: Server) -> None:
    r = post(server, "text-classifier", "attacks", {"inputs": ["a fine film"], **FGSM})
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["path", "model_id"]


def test_a_difference_picture_names_features_and_says_when_nothing_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The difference's bars carry the model's feature names (not f0, f1, ...), and a
    perturbation that changed nothing is titled so (not a blank picture)."""
    from types import SimpleNamespace

    import model_registry
    from service.robustness import serving
    from service.robustness.protocol import PerturbationRender
    from service.serving import render

    seen: list[dict[str, Any]] = []
    real = render.draw

    def spy(options: Any, attribution: Any, **kw: Any) -> render.Rendered:
        seen.append(kw)
        return real(options, attribution, **kw)

    monkeypatch.setattr(render, "draw", spy)
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tabular-mlp"]
    x = np.zeros((2, 8), np.float32)
    moved = x.copy()
    moved[0, 3] = 0.5  # example 0 moved, example 1 not
    job = SimpleNamespace(arrays=(x,), n=2)
    reply = SimpleNamespace(attributions=[moved])
    serving.draw(PerturbationRender(), spec, job, reply, "tabular-mlp · fgsm")  # type: ignore[arg-type]
    assert [kw["title"].endswith("change") for kw in seen] == [True, False]
    assert "no change" in seen[1]["title"]
    assert seen[0]["feature_names"] == list(spec.inputs[0].features)
