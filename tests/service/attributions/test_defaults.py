"""models.toml ``defaults``: per method, the params a request leaves out (e.g. ``n_steps =
"auto"`` for integrated gradients), checked when the server starts, applied to every request
of that method (routes and jobs build their work in one place), and shown in the model's
description."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import model_registry
from model_registry import RegistryError
from service import kinds
from service.app import create_app
from service.attributions.serving import build_work
from service.core.settings import Settings
from service.wire.attributions import AttributionRequest
from tests.service.conftest import Restartable, Server

TABULAR = '[[models]]\nid = "m"\nsource = "builtin:tabular-mlp"\n'
AUTO_IG = '[models.defaults.integrated_gradients]\nn_steps = "auto"\ndelta_tolerance = 0.001\n'
ROW = [[0.5, -1.0, 0.25, 2.0, 0.0, 1.0, -0.5, 0.75]]


def specs(tmp_path: Path, text: str) -> list[model_registry.ModelSpec]:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return model_registry.load_specs(path)


def test_defaults_are_read_per_method(tmp_path: Path) -> None:
    (spec,) = specs(tmp_path, TABULAR + AUTO_IG)
    assert spec.defaults == {"integrated_gradients": {"n_steps": "auto", "delta_tolerance": 0.001}}
    (plain,) = specs(tmp_path, TABULAR)
    assert plain.defaults == {}


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('defaults = "auto"\n', "defaults"),
        ("defaults = { saliency = 3 }\n", "defaults.saliency"),
    ],
)
def test_a_malformed_defaults_table_names_its_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(RegistryError) as err:
        specs(tmp_path, TABULAR + text)
    assert err.value.field == field


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[models.defaults.no_such_method]\nn_steps = 4\n", "defaults.no_such_method"),
        ("[models.defaults.integrated_gradients]\nn_steps = 0\n", "n_steps"),
        ("[models.defaults.saliency]\nn_steps = 4\n", "n_steps"),
    ],
)
def test_defaults_that_cannot_run_stop_the_start(tmp_path: Path, text: str, says: str) -> None:
    (spec,) = specs(tmp_path, TABULAR + text)
    with pytest.raises(ValueError, match="model 'm'") as err:
        kinds.check_defaults(spec, Settings())
    assert says in str(err.value)
    path = tmp_path / "models.toml"
    with pytest.raises(SystemExit, match="defaults"):
        create_app(Settings(models=str(path)), start_workers=False)


def test_a_request_s_own_params_win_over_the_defaults(tmp_path: Path) -> None:
    (spec,) = specs(tmp_path, TABULAR + AUTO_IG)
    settings = Settings()

    def params(**given: object) -> dict[str, object]:
        req = AttributionRequest(
            method="integrated_gradients", inputs=ROW, target=0, params=dict(given)
        )
        work = build_work(settings, spec, req, math.inf)
        return dict(work.params)  # type: ignore[attr-defined]

    assert params()["n_steps"] == "auto" and params()["delta_tolerance"] == 0.001
    assert params(n_steps=16)["n_steps"] == 16
    other = AttributionRequest(method="saliency", inputs=ROW, target=0)
    assert "n_steps" not in dict(build_work(settings, spec, other, math.inf).params)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def server(store_server: Restartable) -> Server:
    """The store server: its "projected" model has integrated gradients default to "auto"."""
    return store_server.current


def test_served_requests_take_the_model_s_defaults(server: Server) -> None:
    with server.client() as c:
        info = c.get("/v1/models/projected").json()
        assert info["defaults"] == {"integrated_gradients": {"n_steps": "auto"}}
        assert c.get("/v1/models/tabular-mlp").json()["defaults"] == {}
        body = {"method": "integrated_gradients", "inputs": ROW, "target": 0}
        auto = c.post("/v1/models/projected/attributions", json=body)
        assert auto.status_code == 200, auto.text
        asked = c.post(
            "/v1/models/projected/attributions", json={**body, "params": {"n_steps": "auto"}}
        )
        assert asked.status_code == 200, asked.text
        # the defaulted request is the one that asks "auto" itself: the same steps and numbers
        assert auto.json()["steps"] == asked.json()["steps"]
        assert auto.json()["params"] == asked.json()["params"]
        assert auto.json()["attributions"] == asked.json()["attributions"]
        assert auto.json()["steps"]["evaluations"] >= 2
        fixed = c.post("/v1/models/projected/attributions", json={**body, "params": {"n_steps": 8}})
        assert fixed.status_code == 200, fixed.text
        assert fixed.json()["params"]["n_steps"] == 8
        assert fixed.json().get("steps") is None
