"""Concept sets as resources of a model and TCAV over HTTP (CONTRACT 7.1): stored, listed,
read back, replaced and deleted; bad names refused; TCAV equal to ``methods.tcav`` on the same
model; activations and CAVs computed once, and still cached after a restart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import methods
from model_registry.builtin import build, image
from tests.service.conftest import Restartable, Server

LAYERS = ["features.3", "classifier.1"]


def squares(n: int, seed: int, quadrant: int) -> torch.Tensor:
    """Images of image-cnn's data with the bright square in ``quadrant``."""
    g = torch.Generator().manual_seed(seed)
    found: list[torch.Tensor] = []
    while len(found) < n:
        x, y = image.make_data(64, g)
        found += [xi for xi, yi in zip(x, y, strict=True) if int(yi) == quadrant]
    return torch.stack(found[:n])


def noise(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, 32, 32, generator=g) * image.NOISE


SETS = {
    "square": squares(20, 1, 0),
    "noise": noise(20, 2),
    **{f"rand{i}": noise(20, 10 + i) for i in range(4)},
}
#: the sets a server stores for the built-in image-cnn (its TCAV demo)
DEMO = sorted(image.concept_sets())
INPUTS = squares(12, 3, 0)


@pytest.fixture(scope="module")
def server(store_server: Restartable) -> Server:
    """The session's store server (tests/service/conftest.py, STORE_TOML)."""
    return store_server.current


def _query(**over: object) -> dict[str, object]:
    return {
        "inputs": INPUTS.tolist(),
        "target": "top-left",
        "concepts": ["square", "noise"],
        "random_concepts": [f"rand{i}" for i in range(4)],
        "layers": LAYERS,
        **over,
    }


def test_concept_sets_are_resources(server: Server) -> None:
    with server.client() as c:
        for name, x in SETS.items():
            r = c.put(f"/v1/models/image-cnn/concepts/{name}", json={"inputs": x.tolist()})
            assert r.status_code == 201, r.text
            assert r.json()["n"] == 20 and r.json()["shape"] == [[3, 32, 32]]
        noisy = {"inputs": SETS["noise"].tolist()}
        again = c.put("/v1/models/image-cnn/concepts/noise", json=noisy)
        assert again.status_code == 200
        assert again.json()["name"] == "noise"
        listed = c.get("/v1/models/image-cnn/concepts").json()["concepts"]
        assert sorted(x["name"] for x in listed) == sorted([*SETS, *DEMO])
        assert {"name", "n", "shape", "updated", "digest"} <= set(listed[0])
        one = c.get("/v1/models/image-cnn/concepts/square").json()
        np.testing.assert_array_equal(np.asarray(one["inputs"], np.float32), SETS["square"])
        # a set of another model's shape is refused as the attributions route refuses it
        bad = c.put("/v1/models/image-cnn/concepts/flat", json={"inputs": [[0.0] * 8]})
        assert bad.status_code == 422 and bad.json()["errors"][0]["loc"][:2] == ["body", "inputs"]
        tmp = c.put("/v1/models/tabular-mlp/concepts/tmp", json={"inputs": [[0.0] * 8] * 3})
        assert tmp.status_code == 201
        assert c.delete("/v1/models/tabular-mlp/concepts/tmp").status_code == 204
        gone = c.get("/v1/models/tabular-mlp/concepts/tmp")
        assert gone.status_code == 404 and gone.json()["errors"][0]["loc"] == ["path", "name"]
        assert c.delete("/v1/models/tabular-mlp/concepts/tmp").status_code == 404
        assert c.get("/v1/models/tabular-mlp/concepts").json() == {"concepts": []}
        assert c.get("/v1/models/nope/concepts").status_code == 404


# "." and ".." percent-encoded: a client would otherwise resolve them in the path itself
@pytest.mark.parametrize("name", ["%2E%2E", "%2E", ".hidden", "a b", "x" * 65, "-x", "a\\b"])
def test_bad_names_are_refused(server: Server, name: str) -> None:
    with server.client() as c:
        r = c.put(f"/v1/models/tabular-mlp/concepts/{name}", json={"inputs": [[0.0] * 8]})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["path", "name"]
        assert c.get(f"/v1/models/tabular-mlp/concepts/{name}").status_code == 422
        # a slash, even encoded, is a path of more segments: no such route
        assert c.put("/v1/models/tabular-mlp/concepts/a%2Fb", json={}).status_code == 404


def test_tcav_equals_the_engine_and_caches(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/models/image-cnn/tcav", json=_query())
        assert r.status_code == 200, r.text
        body = r.json()
        # activations of 6 sets at 2 layers, CAVs of 2 concepts x 4 randoms + 12 null pairs
        assert body["computed"] == 6 * 2 + 2 * (2 * 4 + 12)
        again = c.post("/v1/models/image-cnn/tcav", json=_query()).json()
        assert again["computed"] == 0 and again["scores"] == body["scores"]
    model, _ = build("image-cnn")
    ref = methods.tcav(
        model.eval(),
        INPUTS,
        {k: SETS[k] for k in ("square", "noise")},
        LAYERS,
        target=0,
        random_concepts={f"rand{i}": SETS[f"rand{i}"] for i in range(4)},
    )
    for ours, theirs in zip(body["scores"], ref.scores, strict=True):
        assert ours["concept"] == theirs["concept"] and ours["layer"] == theirs["layer"]
        assert ours["sign_counts"] == pytest.approx(theirs["sign_counts"], abs=1e-12)
        assert ours["magnitude"] == pytest.approx(theirs["magnitude"], rel=1e-4)
        assert ours["significant"] == theirs["significant"]
    rows = {(s["concept"], s["layer"]): s for s in body["scores"]}
    assert all(rows["square", p]["sign_count"] == 1.0 for p in LAYERS)


def test_tcav_errors(server: Server) -> None:
    with server.client() as c:
        unknown = c.post("/v1/models/image-cnn/tcav", json=_query(concepts=["nope"]))
        assert unknown.status_code == 404 and unknown.json()["errors"][0]["loc"] == ["path", "name"]
        layer = c.post("/v1/models/image-cnn/tcav", json=_query(layers=["features.9"]))
        assert layer.status_code == 422 and layer.json()["errors"][0]["loc"] == ["body", "layers"]
        one = c.post("/v1/models/image-cnn/tcav", json=_query(random_concepts=["rand0"]))
        assert one.status_code == 422
        both = c.post("/v1/models/image-cnn/tcav", json=_query(random_concepts=["square", "x"]))
        assert both.status_code == 422
        assert both.json()["errors"][0]["loc"] == ["body", "random_concepts"]
        target = c.post("/v1/models/image-cnn/tcav", json=_query(target="middle"))
        assert target.status_code == 422
        assert target.json()["errors"][0]["loc"][:2] == ["body", "target"]


def test_the_built_in_demo_shows_a_significant_concept_and_an_insignificant_one(
    server: Server,
) -> None:
    """image-cnn's stored sets, queried as the README does: the bright top-left square is
    significant for the top-left class at every layer, the dim noise at none."""
    inputs = image.squares_in(0, 20, torch.Generator().manual_seed(1))
    body = {
        "inputs": inputs.tolist(),
        "target": "top-left",
        "concepts": ["bright-top-left", "dim-noise"],
        "random_concepts": [f"random-{i}" for i in range(image.N_RANDOM)],
        "layers": ["features.3", "classifier.1"],
    }
    with server.client() as c:
        r = c.post("/v1/models/image-cnn/tcav", json=body)
    assert r.status_code == 200, r.text
    rows = {(x["concept"], x["layer"]): x for x in r.json()["scores"]}
    for layer in body["layers"]:
        assert rows["bright-top-left", layer]["significant"]
        assert rows["bright-top-left", layer]["sign_count"] == 1.0
        assert not rows["dim-noise", layer]["significant"]


@pytest.mark.lifecycle
def test_sets_and_cavs_survive_a_restart(server: Server, store_server: Restartable) -> None:
    with server.client() as c:
        first = c.post("/v1/models/image-cnn/tcav", json=_query()).json()
    fresh = store_server.restart()  # stops ``server``, starts on the same data
    with fresh.client() as c:
        listed = c.get("/v1/models/image-cnn/concepts").json()["concepts"]
        assert sorted(x["name"] for x in listed) == sorted([*SETS, *DEMO])
        body = c.post("/v1/models/image-cnn/tcav", json=_query()).json()
        assert body["computed"] == 0 and body["scores"] == first["scores"]
