"""Every numeric parameter states its range on its params model, so the published schema shows
it and a value outside it is a 422 naming the field. The out-of-range values are generated from
the schemas themselves (one per constrained field, union member and nesting), so a parameter
constrained tomorrow is checked the moment it is declared."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from methods import registry
from methods.noise_tunnel import NoiseTunnelParams
from service.app import create_app
from service.core.settings import Settings
from service.robustness.protocol import ATTACK_PARAMS, SEARCH_PARAMS

X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]
#: the methods that attribute images only (xrai, blur_ig) are asked of image-cnn
IMAGE = [[[[0.5] * 32] * 32] * 3]
#: a counterfactual search's own valid params
SEARCH = {"arg_min": 0, "arg_max": 1, "arg_step": 0.25}
#: what each method needs besides the field under test, on tabular-mlp
NEEDS = {"layer": "fc2", "neuron_selector": 0, "sliding_window_shapes": [1]}


def outside(node: dict[str, Any], defs: dict[str, Any]) -> Iterator[Any]:
    """Values that break one of ``node``'s stated bounds (and are no other member's value)."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    for member in node.get("anyOf", []):
        yield from outside(member, defs)
    step = 1 if node.get("type") == "integer" else 0.5
    if "minimum" in node:
        yield node["minimum"] - step
    if "exclusiveMinimum" in node:
        yield node["exclusiveMinimum"]
    if "maximum" in node:
        yield node["maximum"] + step
    if "exclusiveMaximum" in node:
        yield node["exclusiveMaximum"]
    if node.get("type") == "array" and isinstance(node.get("items"), dict):
        yield from ([bad] for bad in outside(node["items"], defs))


def cases() -> list[Any]:
    out = []
    for ms in registry.specs():
        schema = ms.params.model_json_schema()
        for field, node in schema.get("properties", {}).items():
            for bad in dict.fromkeys(map(repr, outside(node, schema.get("$defs", {})))):
                out.append(pytest.param(ms.name, field, eval(bad), id=f"{ms.name}-{field}={bad}"))
    return out


CASES = cases()


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(Settings(), start_workers=False)) as c:
        yield c


def test_the_ranges_are_published() -> None:
    """The constrained fields the audit found, as the schema states them."""
    constrained = {(c.values[0], c.values[1]) for c in CASES}
    for expected in [
        ("integrated_gradients", "n_steps"),
        ("occlusion", "sliding_window_shapes"),
        ("occlusion", "strides"),
        ("gradient_shap", "stdevs"),
        ("lime", "kernel_width"),
        ("kernel_shap", "n_samples"),
        ("deeplift", "eps"),
    ]:
        assert expected in constrained
    nt = NoiseTunnelParams.model_json_schema()["properties"]
    assert list(outside(nt["stdevs"], {})) == [-0.5, [-0.5]]
    assert list(outside(nt["nt_samples"], {})) == [0]


@pytest.mark.parametrize(("method", "field", "bad"), CASES)
def test_a_value_out_of_range_is_a_422_naming_the_field(
    client: TestClient, method: str, field: str, bad: Any
) -> None:
    ms = registry.get(method)
    params = {k: v for k, v in NEEDS.items() if k in ms.params.model_fields}
    model, inputs = ("image-cnn", IMAGE) if ms.images_only else ("tabular-mlp", X)
    body = {"method": method, "inputs": inputs, "target": 0, "params": {**params, field: bad}}
    r = client.post(f"/v1/models/{model}/attributions", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"][:3] == ["body", "params", field], r.json()


@pytest.mark.parametrize(
    ("route", "body", "field"),
    [
        ("attributions", {"method": "saliency", "noise_tunnel": {"stdevs": -0.5}}, "stdevs"),
        ("attributions", {"method": "saliency", "noise_tunnel": {"nt_samples": 0}}, "nt_samples"),
        ("attacks", {"method": "fgsm", "params": {"epsilon": -0.5}}, "epsilon"),
        (
            "attacks",
            {"method": "pgd", "params": {"radius": -1, "step_size": 0.1, "step_num": 2}},
            "radius",
        ),
        (
            "counterfactuals",
            {
                "perturbation": "gaussian_noise",
                "params": {"arg_min": -1, "arg_max": 2, "arg_step": 1},
            },
            "arg_min",
        ),
        (
            "counterfactuals",
            {"perturbation": "fgsm", "params": {**SEARCH, "lower_bound": None}},
            "lower_bound",
        ),
    ],
)
def test_budgets_and_spreads_are_not_negative(
    client: TestClient, route: str, body: dict[str, Any], field: str
) -> None:
    r = client.post(f"/v1/models/tabular-mlp/{route}", json={"inputs": X, **body})
    assert r.status_code == 422, r.text
    assert field in str(r.json()["errors"][0]["loc"]), r.json()


#: valid params of each attack and counterfactual search (tabular-mlp), and the schema that
#: publishes their ranges
PERTURBATIONS = [
    ("attacks", "method", "fgsm", {"epsilon": 0.1}, ATTACK_PARAMS),
    ("attacks", "method", "pgd", {"radius": 0.1, "step_size": 0.01, "step_num": 2}, ATTACK_PARAMS),
    ("counterfactuals", "perturbation", "gaussian_noise", SEARCH, SEARCH_PARAMS),
    ("counterfactuals", "perturbation", "fgsm", SEARCH, SEARCH_PARAMS),
    ("counterfactuals", "perturbation", "pgd", {**SEARCH, "step_size": 0.1}, SEARCH_PARAMS),
]


def perturbation_cases() -> list[Any]:
    out = []
    for route, key, name, valid, schema in PERTURBATIONS:
        for field, node in schema["properties"].items():
            if field not in valid and field not in ("step_num",):
                continue  # a parameter of another attack or search
            if field == "step_num" and name != "pgd":
                continue
            for bad in outside(node, {}):
                out.append(pytest.param(route, key, name, {**valid, field: bad}, field,
                                        id=f"{route}-{name}-{field}={bad}"))  # fmt: skip
    return out


@pytest.mark.parametrize(("route", "key", "name", "params", "field"), perturbation_cases())
def test_an_attack_or_search_out_of_range_is_a_422_naming_the_field(
    client: TestClient, route: str, key: str, name: str, params: dict[str, Any], field: str
) -> None:
    body = {key: name, "inputs": X, "params": params}
    r = client.post(f"/v1/models/tabular-mlp/{route}", json=body)
    assert r.status_code == 422, r.text
    assert field in str(r.json()["errors"][0]["loc"]), r.json()
