"""The OpenAPI document as generated clients need it: every error a route returns declared as
``application/problem+json`` with the one ``Problem`` schema, and the API-key schemes."""

from __future__ import annotations

from typing import Any

from service.middleware import MODEL_PATH, OPEN_PATHS

PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
#: what any route may answer, whatever it declares
ALWAYS = {500: "internal error (the body carries only the request id)"}
#: what every route behind the API keys may answer
KEYED = {401: "missing or wrong API key"}
MODEL = {403: "the API key may not use this model", 404: "unknown model"}
#: FastAPI's default validation-error schemas, replaced by Problem
FASTAPI_SCHEMAS = ("HTTPValidationError", "ValidationError")


def _declare(responses: dict[str, Any], codes: dict[int, str]) -> None:
    for code, text in codes.items():
        responses.setdefault(str(code), {"description": text})


def finish(doc: dict[str, Any]) -> dict[str, Any]:
    schemes = doc.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes["bearer"] = {"type": "http", "scheme": "bearer", "description": "an API key"}
    schemes["apiKey"] = {"type": "apiKey", "in": "header", "name": "X-API-Key"}
    for path, operations in doc.get("paths", {}).items():
        # the path template as a request would have it (model routes)
        sample = path.replace("{model_id}", "m")
        for op in operations.values():
            responses = op.setdefault("responses", {})
            _declare(responses, ALWAYS)
            if OPEN_PATHS.fullmatch(sample) is None:
                _declare(responses, KEYED)
                # keys are optional on a server: none, or either scheme
                op["security"] = [{}, {"bearer": []}, {"apiKey": []}]
                if MODEL_PATH.fullmatch(sample) is not None:
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
    for name in FASTAPI_SCHEMAS:
        doc["components"].get("schemas", {}).pop(name, None)
    return doc
