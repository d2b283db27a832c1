"""Training-data influence over HTTP (CONTRACT 7.4): the index built once per digest as a job
with progress, assembled, persisted and reused (also across a restart); queries and
self-influence equal to ``methods.influence`` / ``methods.self_influence``; the built-in
tabular-noisy's wrong labels found; bad requests refused."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

import methods
from model_registry.builtin import noisy, tabular
from tests.service.conftest import Restartable, Server

FILES = noisy.FILES
CHECKPOINTS = [
    {"weights": str(FILES / f"checkpoint-{i}.pt"), "lr": lr} for i, lr in enumerate(noisy.LRS, 1)
]


@pytest.fixture(scope="module")
def server(store_server: Restartable) -> Server:
    """The session's store server (tests/service/conftest.py, STORE_TOML)."""
    return store_server.current


def ready(server: Server, model: str, timeout: float = 120) -> dict:
    """The model's influence state once its index is ready (the states seen on the way)."""
    seen = []
    end = time.monotonic() + timeout
    with server.client() as c:
        while time.monotonic() < end:
            state = c.get(f"/v1/models/{model}").json()["influence"]
            seen.append(state["status"])
            if state["status"] == "ready":
                return {**state, "seen": seen}
            assert state["status"] == "building", state
            time.sleep(0.1)
    raise TimeoutError(seen)


def reference() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    model = tabular.TabularMLP()
    x, y, _ = noisy.data()
    return model, x, y


def test_the_index_is_built_as_a_job_and_finds_the_wrong_labels(server: Server) -> None:
    state = ready(server, "tabular-noisy")
    assert state["method"] == "tracin_cp" and state["n_train"] == noisy.N_TRAIN
    assert state["bytes"] > 0 and state["job_id"]
    with server.client() as c:
        job = c.get(f"/v1/jobs/{state['job_id']}").json()
        assert job["status"] == "succeeded" and job["method"] == "influence_index"
        assert job["progress"] == {"done": noisy.N_TRAIN, "total": noisy.N_TRAIN}
        assert c.get("/v1/models/tabular-mlp").json()["influence"] is None
        r = c.get("/v1/models/tabular-noisy/influence/self", params={"k": 20})
        assert r.status_code == 200, r.text
        body = r.json()
    _, _, flipped = noisy.data()
    assert set(flipped.tolist()) <= set(body["indices"])  # all 12 wrong labels in the top 20
    model, x, y = reference()
    ref = methods.self_influence(model, x, y, checkpoints=CHECKPOINTS)
    top = torch.topk(ref, 20)
    assert body["indices"] == top.indices.tolist()
    np.testing.assert_allclose(body["scores"], top.values.numpy(), rtol=1e-5)
    assert body.get("examples") is None
    # include_examples: each listed example's own inputs and label, in the list's order
    with server.client() as c:
        r = c.get("/v1/models/tabular-noisy/influence/self",
                  params={"k": 5, "include_examples": "true"})  # fmt: skip
    assert r.status_code == 200, r.text
    shown = r.json()
    assert [e["index"] for e in shown["examples"]] == shown["indices"] == body["indices"][:5]
    for e in shown["examples"]:
        np.testing.assert_allclose(e["inputs"], x[e["index"]].numpy(), rtol=1e-6)
        assert e["label"] == int(y[e["index"]])


def test_queries_equal_the_engine(server: Server) -> None:
    ready(server, "tabular-noisy")
    g = torch.Generator().manual_seed(5)
    test_x = torch.randn(4, tabular.N_FEATURES, generator=g)
    labels = ["low", "mid", "high", "mid"]
    with server.client() as c:
        r = c.post(
            "/v1/models/tabular-noisy/influence",
            json={"inputs": test_x.tolist(), "labels": labels, "k": 3, "opponents": True},
        )
        assert r.status_code == 200, r.text
        body = r.json()
    model, x, y = reference()
    test_y = torch.tensor([tabular.LABELS.index(v) for v in labels])
    for side, proponents in (("proponents", True), ("opponents", False)):
        ref = methods.influence(
            model, x, y, test_x, test_y, checkpoints=CHECKPOINTS, k=3, proponents=proponents
        )
        assert [e["indices"] for e in body[side]] == ref.indices.tolist()
        got = np.array([e["scores"] for e in body[side]])
        np.testing.assert_allclose(got, ref.scores.numpy(), rtol=1e-4, atol=1e-6)
        assert all(e.get("examples") is None for e in body[side])
    # include_examples: each listed training example's own inputs and label, in order
    with server.client() as c:
        query = {"inputs": test_x.tolist(), "labels": labels, "k": 3, "include_examples": True}
        r = c.post("/v1/models/tabular-noisy/influence", json=query)
    assert r.status_code == 200, r.text
    for top in r.json()["proponents"]:
        assert [e["index"] for e in top["examples"]] == top["indices"]
        for e in top["examples"]:
            np.testing.assert_allclose(e["inputs"], x[e["index"]].numpy(), rtol=1e-6)
            assert e["label"] == int(y[e["index"]])
            assert e["label_name"] == tabular.LABELS[e["label"]]


def test_a_projected_index_from_models_toml(server: Server) -> None:
    state = ready(server, "projected")
    assert state["method"] == "tracin_cp_fast_rand_proj"
    test_x = torch.randn(3, tabular.N_FEATURES, generator=torch.Generator().manual_seed(6))
    with server.client() as c:
        body = c.post(
            "/v1/models/projected/influence", json={"inputs": test_x.tolist(), "target": 1}
        ).json()
        none = c.get("/v1/models/projected/influence/self")
        assert none.status_code == 409 and "not defined" in none.json()["detail"]
    model, x, y = reference()
    ref = methods.influence(
        model,
        x,
        y,
        test_x,
        torch.tensor([1, 1, 1]),
        method="tracin_cp_fast_rand_proj",
        checkpoints=[
            {"weights": str(FILES / f"checkpoint-{i}.pt"), "lr": lr}
            for i, lr in ((2, 0.1), (3, 0.05))
        ],
        projection_dim=2,
        seed=3,
        k=5,
    )
    assert [e["indices"] for e in body["proponents"]] == ref.indices.tolist()


def test_bad_requests(server: Server) -> None:
    ready(server, "tabular-noisy")
    row = [[0.0] * tabular.N_FEATURES]
    with server.client() as c:
        url = "/v1/models/tabular-noisy/influence"
        big = c.post(url, json={"inputs": row, "k": noisy.N_TRAIN + 1})
        assert big.status_code == 422 and big.json()["errors"][0]["loc"] == ["body", "k"]
        both = c.post(url, json={"inputs": row, "labels": 0, "target": 0})
        assert both.status_code == 422
        label = c.post(url, json={"inputs": row, "labels": "medium"})
        assert label.status_code == 422 and label.json()["errors"][0]["loc"][:2] == [
            "body",
            "labels",
        ]
        shape = c.post(url, json={"inputs": [[0.0] * 3]})
        assert shape.status_code == 422
        zero = c.get("/v1/models/tabular-noisy/influence/self", params={"k": 0})
        assert zero.status_code == 422
        none = c.post("/v1/models/tabular-mlp/influence", json={"inputs": row})
        assert none.status_code == 404 and "influence" in none.json()["detail"]
        assert c.get("/v1/models/nope/influence/self").status_code == 404


def test_predicted_labels_are_the_model_s_own_class(server: Server) -> None:
    """ "predicted" (as labels or target) is each example's predicted class, as null is."""
    ready(server, "tabular-noisy")
    rows = np.random.default_rng(0).normal(size=(3, tabular.N_FEATURES)).tolist()
    url = "/v1/models/tabular-noisy/influence"
    with server.client() as c:
        plain = c.post(url, json={"inputs": rows, "k": 3})
        assert plain.status_code == 200, plain.text
        for field in ("labels", "target"):
            got = c.post(url, json={"inputs": rows, "k": 3, field: "predicted"})
            assert got.status_code == 200, got.text
            assert got.json()["proponents"] == plain.json()["proponents"]
        mixed = c.post(url, json={"inputs": rows, "k": 3, "labels": [0, "predicted", 1]})
        assert mixed.status_code == 422 and mixed.json()["errors"][0]["loc"][:2] == [
            "body",
            "labels",
        ]
        extra = c.post(url, json={"inputs": rows, "predicted": True})
        assert extra.status_code == 422


@pytest.mark.lifecycle
def test_the_index_is_reused_after_a_restart(server: Server, store_server: Restartable) -> None:
    first = ready(server, "tabular-noisy")
    fresh = store_server.restart()  # stops ``server``, starts on the same data
    with fresh.client() as c:
        state = c.get("/v1/models/tabular-noisy").json()["influence"]
        assert state["status"] == "ready" and state["job_id"] == first["job_id"]
        jobs = c.get("/v1/jobs").json()["jobs"]
        assert sum(j["model_id"] == "tabular-noisy" for j in jobs) == 1  # not built again
        assert c.get("/v1/models/tabular-noisy/influence/self").status_code == 200


def test_an_index_that_cannot_be_followed_fails_alone(tmp_path: Path) -> None:
    """A damaged job.json marks that model's index failed; the server starts and serves."""
    from fastapi.testclient import TestClient

    import model_registry
    from service.app import create_app
    from service.core.settings import Settings

    toml = tmp_path / "models.toml"
    toml.write_text('[[models]]\nid = "tabular-noisy"\nsource = "builtin:tabular-noisy"\n')
    (spec,) = model_registry.load_specs(str(toml))
    root = tmp_path / "data" / "influence" / "tabular-noisy" / spec.influence.digest(spec.version)
    root.mkdir(parents=True)
    (root / "job.json").write_text("{not json")
    settings = Settings(
        workers=1, data_dir=str(tmp_path / "data"), models=str(toml), worker_mode="thread"
    )
    with TestClient(create_app(settings)) as c:
        state = c.get("/v1/models/tabular-noisy").json()["influence"]
        assert state["status"] == "failed" and "JSONDecodeError" in state["error"]
        r = c.get("/v1/models/tabular-noisy/influence/self")
        assert r.status_code == 409 and "failed" in r.json()["detail"]
        assert c.get("/v1/health/live").status_code == 200


def test_labels_take_the_losss_form() -> None:
    """Class indices or label names for cross_entropy/nll; a float tensor, one row per
    example, for mse and bce_with_logits; else a 422 naming the field."""
    import dataclasses

    import model_registry
    from service.core.errors import InvalidRequest
    from service.core.settings import Settings
    from service.influence.serving import _labels

    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tabular-noisy"]
    settings = Settings()
    assert _labels(settings, spec, ["low", 2], 2, "labels").tolist() == [0, 2]
    assert _labels(settings, spec, "mid", 3, "target").tolist() == [1, 1, 1]
    with pytest.raises(InvalidRequest) as e:
        _labels(settings, spec, [0.5, 1.5], 2, "labels")
    assert e.value.errors[0]["loc"][:2] == ["body", "labels"]
    mse = dataclasses.replace(spec, influence=dataclasses.replace(spec.influence, loss="mse"))
    got = _labels(settings, mse, [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], 2, "labels")
    assert got.dtype == np.float32 and got.shape == (2, 3)
    with pytest.raises(InvalidRequest, match="one row per example"):
        _labels(settings, mse, [[0.0, 1.0, 0.0]], 2, "labels")
