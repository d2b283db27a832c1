"""The OpenAPI document as generated clients need it.

- every error a route returns declared as ``application/problem+json`` with the one ``Problem``
  schema, and the API-key schemes;
- the wire's schemas (``service.wire.schemas.WIRE_SCHEMAS``: tensors, inputs, targets)
  named once under ``components/schemas``, by their titles, where pydantic writes them inline;
- the attribution request as a union discriminated by ``method``: one request schema per
  registered method, its ``params`` typed by the method's params model (the schema
  ``GET /v1/methods`` publishes), so a generated client has one params class per method. The
  server still reads ``params`` as an object and the engine validates it: an unknown method gets
  the server's own 404, whatever the document says;
- request schemas without ``default``: openapi-typescript types a property that has one as
  always present, which a request field with a default is not (the default goes into the
  description).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from methods import registry
from methods.params import TENSOR_SCHEMA as PARAM_TENSOR
from service.http.routing import DEFAULT, Policy
from service.wire.catalog import method_list
from service.wire.schemas import TENSOR, WIRE_SCHEMAS

REF = "#/components/schemas/"
PROBLEM_REF = {"$ref": REF + "Problem"}
#: what any route may answer, whatever it declares
ALWAYS = {500: "internal error (the body carries only the request id)"}
#: what every route behind the API keys may answer
KEYED = {401: "missing or wrong API key"}
MODEL = {403: "the API key may not use this model", 404: "unknown model"}
#: FastAPI's default validation-error schemas, replaced by Problem
FASTAPI_SCHEMAS = ("HTTPValidationError", "ValidationError")
#: the request schema that becomes a union over the methods
REQUEST = "AttributionRequest"


#: request body schemas of the raw routes, for the document's components (``AttrServe.openapi``)
RAW_SCHEMAS: dict[str, Any] = {}


def raw_body(
    model: type[Any], description: str, *, binary: bool = False, required: bool = True
) -> dict[str, Any]:
    """The request body as documented: the raw routes read bytes, FastAPI does not see it.

    ``binary``: OIP's binary tensor form is taken too. It is named in the description, not
    declared as a second media type: openapi-python-client (0.29) writes an operation with two
    as ``body: A | File | Unset = UNSET`` without importing ``Unset``, and the generated module
    fails at import (openapi-generators/openapi-python-client#1451)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    RAW_SCHEMAS.update(schema.pop("$defs", {}))
    RAW_SCHEMAS[model.__name__] = schema
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}
    if binary:
        description += ". Also taken as application/octet-stream."
    return {"requestBody": {"required": required, "description": description, "content": content}}


#: keys a use of a named schema may add or change beside its ``$ref``
SIBLINGS = ("title", "description", "default")


def finish(doc: dict[str, Any], policies: dict[str, Policy]) -> dict[str, Any]:
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    _errors_and_keys(doc, policies)
    for name in FASTAPI_SCHEMAS:
        schemas.pop(name, None)
    if REQUEST in schemas:
        _method_union(schemas)
    _name_wire_schemas(doc)
    _no_request_defaults(doc)
    return doc


def _declare(responses: dict[str, Any], codes: dict[int, str]) -> None:
    for code, text in codes.items():
        responses.setdefault(str(code), {"description": text})


def _errors_and_keys(doc: dict[str, Any], policies: dict[str, Policy]) -> None:
    """Each operation's errors, and its security as its route declares it (``policies``: each
    route's path template and its policy)."""
    schemes = doc["components"].setdefault("securitySchemes", {})
    schemes["bearer"] = {"type": "http", "scheme": "bearer", "description": "an API key"}
    schemes["apiKey"] = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    for path, operations in doc.get("paths", {}).items():
        policy = policies.get(path, DEFAULT)
        for op in operations.values():
            responses = op.setdefault("responses", {})
            _declare(responses, ALWAYS)
            if policy.keyed:
                _declare(responses, KEYED)
                # keys are optional on a server: none, or either scheme
                op["security"] = [{}, {"bearer": []}, {"apiKey": []}]
                if "{model_id}" in path:
                    _declare(responses, MODEL)
            for code, response in responses.items():
                if not code.isdigit() or int(code) < 400:
                    continue
                content = response.get("content", {})
                schemas = [c.get("schema", {}).get("$ref", "") for c in content.values()]
                if content and not all(
                    ref.endswith(("/Problem", *FASTAPI_SCHEMAS)) for ref in schemas
                ):
                    continue  # a route's own error body (e.g. /ready's 503 Health)
                response["content"] = {"application/problem+json": {"schema": PROBLEM_REF}}
                if code == "422" and response.get("description") == "Validation Error":
                    response["description"] = "valid JSON that cannot be served"


# --- the request: one schema per method --------------------------------------------------------


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _method_union(schemas: dict[str, Any]) -> None:
    """``AttributionRequest`` becomes a ``oneOf`` of ``<Method>Request``, each with ``method``
    fixed and ``params`` a ``$ref`` to ``<Method>Params``."""
    base = schemas[REQUEST]
    _share_fields(base, schemas)
    mapping: dict[str, str] = {}
    for info in method_list().methods:  # what GET /v1/methods publishes
        stem = _pascal(info.name)
        params = _params_schema(info.name, info.params, stem, schemas)
        schemas[stem + "Params"] = params
        request = copy.deepcopy(base)
        request["title"] = stem + "Request"
        request["description"] = f"{info.name}: {info.description or base['description']}"
        props = request["properties"]
        props["method"] = {**props["method"], "type": "string", "const": info.name}
        described = {k: v for k, v in props["params"].items() if k == "description"}
        props["params"] = {"$ref": REF + stem + "Params", **described}
        if params.get("required"):  # e.g. occlusion's window, a layer method's layer
            request["required"] = [*request.get("required", []), "params"]
        schemas[stem + "Request"] = request
        mapping[info.name] = REF + stem + "Request"
    schemas[REQUEST] = {
        "title": REQUEST,
        "description": base.get("description", "")
        + " One schema per method (GET /v1/methods), told apart by `method`.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "method", "mapping": mapping},
    }


def _share_fields(base: dict[str, Any], schemas: dict[str, Any]) -> None:
    """The request fields every method shares are named once (``InternalBatchSize``), not
    written out in each method's request (generators would make a class of each copy); plain
    ones (a boolean) stay as they are."""
    wire = [_core(s) for s in WIRE_SCHEMAS]
    for field, schema in base["properties"].items():
        name, core = _pascal(field), _core(schema)
        if field in ("method", "params") or name in schemas or "$ref" in core or core in wire:
            continue
        if any(k in core for k in ("enum", "anyOf", "oneOf", "properties", "additionalProperties")):
            schemas[name] = {**core, "title": name}
            kept = {k: schema[k] for k in SIBLINGS[1:] if k in schema}
            base["properties"][field] = {"$ref": REF + name, **kept}


def _params_schema(
    method: str, schema: dict[str, Any], stem: str, schemas: dict[str, Any]
) -> dict[str, Any]:
    """The method's params schema as the HTTP API takes it: without the Python-only params
    (callables), its own definitions moved to components under the method's name."""
    schema = copy.deepcopy(schema)
    for name in registry.get(method).python_only_params:
        schema.get("properties", {}).pop(name, None)
        if name in schema.get("required", ()):
            schema["required"].remove(name)
    if not schema.get("required"):
        schema.pop("required", None)
    for name, sub in schema.pop("$defs", {}).items():
        schemas[stem + name] = _move_refs(sub, "#/$defs/", REF + stem)
    schema = _move_refs(schema, "#/$defs/", REF + stem)
    schema["title"] = stem + "Params"
    return schema


def _move_refs(node: Any, old: str, new: str) -> Any:
    if isinstance(node, list):
        return [_move_refs(v, old, new) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _move_refs(v, old, new) for k, v in node.items()}
    if isinstance(out.get("$ref"), str) and out["$ref"].startswith(old):
        out["$ref"] = new + out["$ref"].removeprefix(old)
    return out


# --- the wire's schemas, named once ------------------------------------------------------------


def _core(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k not in SIBLINGS}


def _name_wire_schemas(doc: dict[str, Any]) -> None:
    """Where a wire schema is written out inline (pydantic does), refer to it by name: a
    schema with the wire schema's title and keywords; also the engine's tensor params."""
    named = [(s["title"], _core(s)) for s in WIRE_SCHEMAS]
    param_tensor = _core(PARAM_TENSOR)

    def refer(node: Any, itself: str | None = None) -> Any:
        if isinstance(node, list):
            return [refer(v) for v in node]
        if not isinstance(node, dict):
            return node
        core = _core(node)
        title = node.get("title")
        name = next((t for t, c in named if t == title != itself and c == core), None)
        if name is None and core == param_tensor:
            name = TENSOR["title"]
        if name is not None:
            wire = next(s for s in WIRE_SCHEMAS if s["title"] == name)
            keep = {k: node[k] for k in SIBLINGS[1:] if k in node and node[k] != wire.get(k)}
            return {"$ref": REF + name, **keep}
        return {k: v if k in ("example", "examples") else refer(v) for k, v in node.items()}

    schemas = doc["components"]["schemas"]
    for name, schema in list(schemas.items()):
        schemas[name] = refer(schema)
    for wire in WIRE_SCHEMAS:
        schemas[wire["title"]] = refer(wire, itself=wire["title"])
    doc["paths"] = refer(doc.get("paths", {}))


# --- request schemas without defaults ----------------------------------------------------------


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def _request_schemas(doc: dict[str, Any]) -> set[str]:
    """The component schemas a request body or parameter refers to, directly or not."""
    schemas = doc["components"]["schemas"]
    todo = [
        ref
        for op in (o for ops in doc.get("paths", {}).values() for o in ops.values())
        for part in (op.get("requestBody", {}), op.get("parameters", []))
        for ref in _refs(part)
    ]
    seen: set[str] = set()
    while todo:
        name = todo.pop().removeprefix(REF)
        if name not in seen and name in schemas:
            seen.add(name)
            todo.extend(_refs(schemas[name]))
    return seen


def _drop_defaults(node: Any) -> None:
    if isinstance(node, list):
        for v in node:
            _drop_defaults(v)
        return
    if not isinstance(node, dict):
        return
    for prop in node.get("properties", {}).values():
        if isinstance(prop, dict) and "default" in prop:
            default = prop.pop("default")
            if default not in (None, {}, []):
                text = prop.get("description", "").rstrip(".")
                note = f"Default: {json.dumps(default)}."
                prop["description"] = f"{text}. {note}" if text else note
    for k, v in node.items():
        if k not in ("example", "examples"):
            _drop_defaults(v)


def _no_request_defaults(doc: dict[str, Any]) -> None:
    """openapi-typescript makes a property with a ``default`` required (the server fills it
    in, so a response always has it); in a request such a property is optional."""
    schemas = doc["components"]["schemas"]
    for name in _request_schemas(doc):
        _drop_defaults(schemas[name])
