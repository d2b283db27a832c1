"""The committed openapi/openapi.json is valid and matches the app (regenerate: make openapi)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from service.cli import openapi_spec, openapi_text

COMMITTED = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
ROUTES = {
    ("get", "/v1/health/live"),
    ("get", "/v1/health/ready"),
    ("get", "/v1/models"),
    ("get", "/v1/models/{model_id}"),
    ("get", "/v1/methods"),
    ("post", "/v1/models/{model_id}/attributions"),
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
