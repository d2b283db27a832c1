"""The committed openapi/openapi.json is valid and matches the app (regenerate: make openapi)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import methods
from methods import registry
from service.cli.main import openapi_spec, openapi_text
from service.wire.catalog import method_list

COMMITTED = Path(__file__).resolve().parents[3] / "openapi" / "openapi.json"
ROUTES = {
    ("get", "/v1/health/live"),
    ("get", "/v1/health/ready"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model_id}"),
    ("get", "/v1/methods"),
    ("post", "/v1/models/{model_id}/attributions"),
    ("post", "/v1/models/{model_id}/attributions:render"),
    ("get", "/metrics"),
}


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        out = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return out + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_committed_spec_matches_the_app() -> None:
    assert COMMITTED.read_text() == openapi_text(), (
        "openapi/openapi.json drifted from the app; regenerate it with `make openapi`"
    )


def test_spec_is_valid() -> None:
    spec = openapi_spec()
    assert spec["openapi"].startswith("3.") and spec["info"]["title"] == "attrserve"
    assert {(m, p) for p, ops in spec["paths"].items() for m in ops} >= ROUTES
    for ref in _refs(spec):  # every reference resolves
        node: Any = spec
        assert ref.startswith("#/")
        for part in ref[2:].split("/"):
            node = node[part]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("responses"), (method, path)
            assert op.get("operationId"), (method, path)
    post = spec["paths"]["/v1/models/{model_id}/attributions"]["post"]
    content = post["requestBody"]["content"]["application/json"]
    assert len(content["examples"]) >= 3
    assert {"400", "401", "403", "404", "413", "422", "429", "503", "504"} <= set(post["responses"])
    json.dumps(spec)  # plain JSON
    try:  # the full validator when installed (not a dependency)
        from openapi_spec_validator import validate
    except ImportError:
        return
    validate(spec)


# --- what client generators read (tests/service/http/test_generated_clients.py uses them) ---------

SCHEMAS = "#/components/schemas/"


def _schema(spec: dict[str, Any], ref: str) -> dict[str, Any]:
    node: dict[str, Any] = spec["components"]["schemas"][ref.removeprefix(SCHEMAS)]
    return node


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return openapi_spec()


def _validator(spec: dict[str, Any], name: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    root = {"$ref": SCHEMAS + name, "components": spec["components"]}
    return jsonschema.Draft202012Validator(root)


def test_request_is_a_union_discriminated_by_method(spec: dict[str, Any]) -> None:
    """One request schema per registered method, ``method`` fixed, ``params`` the method's
    params schema as GET /v1/methods publishes it (less the Python-only callables)."""
    union = spec["components"]["schemas"]["AttributionRequest"]
    names = [m.name for m in methods.available()]
    assert union["discriminator"]["propertyName"] == "method"
    mapping = union["discriminator"]["mapping"]
    assert sorted(mapping) == sorted(names)
    assert [arm["$ref"] for arm in union["oneOf"]] == [mapping[n] for n in names]
    published = {m.name: m.params for m in method_list().methods}
    for name, ref in mapping.items():
        request = _schema(spec, ref)
        assert request["properties"]["method"]["const"] == name
        params = _schema(spec, request["properties"]["params"]["$ref"])
        python_only = registry.get(name).python_only_params
        assert set(params["properties"]) == set(published[name]["properties"]) - python_only
        required = set(published[name].get("required", ())) - python_only
        assert set(params.get("required", ())) == required
        assert request["required"] == ["method", "inputs", *(["params"] if required else [])]
    post = spec["paths"]["/v1/models/{model_id}/attributions"]["post"]
    assert post["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": SCHEMAS + "AttributionRequest"
    }


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, ops in spec["paths"].items() for m, op in ops.items()]


def test_one_media_type_per_request_and_success(spec: dict[str, Any]) -> None:
    """Generated clients type a body by all of its media types: two request media types broke
    openapi-python-client's module (``Unset`` unimported), two response media types made
    openapi-fetch's ``data`` a union. The picture is its own operation, ``render``."""
    for method, path, op in _operations(spec):
        assert len(op.get("requestBody", {}).get("content", {})) <= 1, (method, path)
    infer = spec["paths"]["/v2/models/{model_id}/infer"]["post"]["requestBody"]
    assert "application/octet-stream" in infer["description"]  # still said, in words
    ok = spec["paths"]["/v1/models/{model_id}/attributions"]["post"]["responses"]["200"]
    assert list(ok["content"]) == ["application/json"]
    assert "attributions:render" in ok["description"]  # the picture, one call away
    render = spec["paths"]["/v1/models/{model_id}/attributions:render"]["post"]
    assert render["operationId"] == "render"
    assert list(render["responses"]["200"]["content"]) == ["image/png", "text/html"]
    attribute = spec["paths"]["/v1/models/{model_id}/attributions"]["post"]
    assert (
        render["requestBody"]["content"]["application/json"]["schema"]
        == (attribute["requestBody"]["content"]["application/json"]["schema"])
    )
    assert {"400", "401", "403", "404", "422", "429", "503", "504"} <= set(render["responses"])
    request = _validator(spec, "AttributionRequest")
    for example in render["requestBody"]["content"]["application/json"]["examples"].values():
        request.validate(example["value"])


def _request_schemas(spec: dict[str, Any]) -> set[str]:
    todo = [
        r
        for ops in spec["paths"].values()
        for op in ops.values()
        for r in _refs(op.get("requestBody"))
    ]
    seen: set[str] = set()
    while todo:
        ref = todo.pop()
        if ref not in seen:
            seen.add(ref)
            todo.extend(_refs(_schema(spec, ref)))
    return seen


def test_optional_fields_are_not_required(spec: dict[str, Any]) -> None:
    """Request schemas carry no ``default`` (openapi-typescript would make the field required);
    responses require what the server always sends, and only that."""
    for ref in _request_schemas(spec):
        for name, prop in _schema(spec, ref).get("properties", {}).items():
            assert "default" not in prop, (ref, name)
    schemas = spec["components"]["schemas"]
    assert schemas["RenderSpec"].get("required", []) == []
    assert sorted(schemas["Problem"]["required"]) == ["detail", "status", "title", "type"]
    response = schemas["AttributionResponse"]["required"]
    assert {"attributions", "outputs", "target", "params", "timing_ms"} <= set(response)
    assert not {"convergence_delta", "tokens", "renders", "requested_method"} & set(response)


TENSOR_B64 = {"dtype": "float32", "shape": [1, 2], "b64": "AAAAAAAAgD8="}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Inputs", [[0.1, 0.2], [0.3, 0.4]]),
        ("Inputs", [[[[0.0]]]]),
        ("Inputs", [1, 2, 3]),
        ("Inputs", TENSOR_B64),
        ("Inputs", [TENSOR_B64, TENSOR_B64]),
        ("Inputs", [TENSOR_B64, [[1.0, 2.0]]]),
        ("Inputs", {"a": [[1.0, 2.0, 3.0]], "b": TENSOR_B64}),
        ("Inputs", ["a wonderful film", "a dull plot"]),
        ("Target", 3),
        ("Target", [3, 1, 0]),
        ("Target", "cat"),
        ("Target", "predicted"),
        ("Target", ["cat", "dog"]),
        ("Target", {"index": [2, 3]}),
        ("Target", [{"index": [0]}, {"index": [1]}]),
        ("Target", None),
        ("Baselines", None),
        ("Baselines", 0.5),
        ("Baselines", [[0.0, 0.0]]),
        ("Baselines", TENSOR_B64),
        ("Baselines", [0.0, [[1.0, 2.0]]]),
        ("Baselines", [TENSOR_B64, 0.0]),
        ("Baselines", {"a": 0.0, "b": [[1.0]]}),
        ("Tensor", [[1, 0], [0, 1]]),
        ("Tensor", TENSOR_B64),
    ],
)
def test_wire_schemas_take_every_form(spec: dict[str, Any], name: str, value: Any) -> None:
    """Each form the codec takes matches exactly one arm of its ``oneOf``."""
    _validator(spec, name).validate(value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Inputs", "one text"),
        ("Inputs", [None, None]),
        ("Inputs", {"dtype": "float32", "shape": [1], "b64": 3}),
        ("Target", {"index": []}),
        ("Target", 1.5),
        ("TensorB64", {"dtype": "float32", "shape": [1]}),
    ],
)
def test_wire_schemas_refuse(spec: dict[str, Any], name: str, value: Any) -> None:
    assert not _validator(spec, name).is_valid(value)


def test_examples_and_responses_match_their_schemas(spec: dict[str, Any]) -> None:
    post = spec["paths"]["/v1/models/{model_id}/attributions"]["post"]
    request = _validator(spec, "AttributionRequest")
    for example in post["requestBody"]["content"]["application/json"]["examples"].values():
        request.validate(example["value"])
    response = _validator(spec, "AttributionResponse")
    body: dict[str, Any] = {
        "model_id": "two-input",
        "model_version": "1",
        "method": "saliency",
        "attributions": [[[1.0, None, 1.0]], [[2.0, 0.0]]],  # NaN travels as null
        "convergence_delta": None,
        "target": [0],
        "outputs": [0.5],
        "params": {"abs": True},
        "timing_ms": {"queue": 0.1, "compute": 1.0, "total": 1.2},
    }
    response.validate(body)
    response.validate({**body, "attributions": [TENSOR_B64, TENSOR_B64], "outputs": TENSOR_B64})
