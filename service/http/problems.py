"""The one problem+json envelope (RFC 9457), and the one place errors are mapped to it."""

from __future__ import annotations

import difflib
import re
from typing import Any, get_args

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from methods.errors import AttributionError
from service.core.context import request_id
from service.core.errors import (
    WHERE,
    BodyTooLarge,
    InvalidRequest,
    MalformedRequest,
    NotFound,
    ServiceError,
)
from service.http.responses import ProblemResponse
from service.wire.engine_errors import from_engine

TYPE_BASE = "https://attrserve.dev/problems/"
#: KServe V1 and OIP routes: their problems also carry ``error``
COMPAT_PATHS = re.compile(r"/v2(/.*)?|/v1/models/[^/]+:(predict|explain)")
#: what FastAPI's exception middleware answers (the rest reaches its server-error middleware)
HANDLED = (ServiceError, RequestValidationError, AttributionError, HTTPException)


def problem(err: ServiceError, instance: str | None = None) -> ProblemResponse:
    """The problem+json response for ``err``; on the KServe and OIP routes the detail is also
    the ``error`` member, the one their clients read."""
    return ProblemResponse(
        problem_body(err, instance), status_code=err.status, headers=err.headers or None
    )


def problem_body(err: ServiceError, instance: str | None = None) -> dict[str, Any]:
    """The problem object of ``err`` (what ``problem`` answers, and a stream's error event)."""
    body: dict[str, Any] = {
        "type": TYPE_BASE + err.code,
        "title": err.title,
        "status": err.status,
        "detail": err.detail,
        "errors": err.errors,
        **err.members,
    }
    if instance:
        body["instance"] = instance
    rid = request_id.get()
    if rid:
        body["request_id"] = rid
    if instance and COMPAT_PATHS.fullmatch(instance):
        body["error"] = err.detail
    return body


def _message(e: dict[str, Any]) -> str:
    """pydantic's message; for bad JSON with the parser's own words (never the input)."""
    msg = str(e.get("msg", ""))
    if e.get("type") == "json_invalid" and (e.get("ctx") or {}).get("error"):
        return f"{msg}: {e['ctx']['error']}"
    return msg


def _model_at(model: Any, path: list[Any]) -> type[BaseModel] | None:
    """The pydantic model holding the field at ``path`` inside ``model`` (list indices and
    optional or union types passed through); None where it cannot be told."""
    current: Any = model
    for key in path:
        found = _models_in(current)
        if isinstance(key, int):
            current = next((m for m in _inner(current) if m is not None), None)
            continue
        field = next((m.model_fields[key] for m in found if key in m.model_fields), None)
        if field is None:
            return None
        current = field.annotation
    found = _models_in(current)
    return found[0] if len(found) == 1 else None


def _inner(tp: Any) -> list[Any]:
    return list(get_args(tp)) or [None]


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The pydantic models a type is or may be (``X | None``, ``list[X]`` looked through)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    out: list[type[BaseModel]] = []
    for arg in get_args(tp):
        out += _models_in(arg)
    return out


def _unknown_field(e: dict[str, Any], body: Any) -> str:
    """An unknown field's message: the nearest known name, and the known names."""
    *path, name = e["loc"][1:] or [""]
    holder = _model_at(body, path) if body is not None else None
    if holder is None or not isinstance(name, str):
        return f"unknown field {name!r}"
    known = [f.alias or n for n, f in holder.model_fields.items()]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown field {name!r}{hint} (the fields here: {', '.join(known)})"


def _validation(exc: RequestValidationError, body: Any = None) -> ServiceError:
    """``body``: the route's body model, for the names an unknown field is compared with."""
    # pydantic's "input" and "ctx" echo what was sent: left out (size, and bytes that are not
    # Unicode), the location and message say what is wrong
    errors = [
        {"loc": list(e.get("loc", ())), "msg": _message(e), "type": e.get("type", "")}
        for e in exc.errors()
    ]
    for e in errors:
        if e["type"] == "extra_forbidden" and e["loc"][:1] == ["body"]:
            e["msg"] = _unknown_field(e, body)
    if any(e["type"] in ("json_invalid", "model_attributes_type") for e in errors) or any(
        e["loc"] == ["body"] and e["type"] == "missing" for e in errors
    ):
        detail = "the request body is not a JSON object: " + "; ".join(e["msg"] for e in errors)
        return MalformedRequest(detail, errors=errors)
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    return InvalidRequest(f"{WHERE}: {first['msg']}", errors=errors, about=tuple(first["loc"]))


#: a KServe verb written as a path segment: ``/v1/models/x/explain`` for ``/v1/models/x:explain``
_VERB_AS_SEGMENT = re.compile(r"/v1/models/(?P<model>[^/:]+)/(?P<verb>predict|explain)")


def _http(exc: HTTPException, path: str = "", method: str = "") -> ServiceError:
    slip = _VERB_AS_SEGMENT.fullmatch(path) if exc.status_code in (404, 405) else None
    if slip is not None:
        return NotFound(
            f"no route {path}: KServe's verb follows a colon, POST "
            f"/v1/models/{slip['model']}:{slip['verb']}",
            loc=("path",),
        )
    detail = str(exc.detail)
    allow = (exc.headers or {}).get("Allow", "")
    if exc.status_code == 405 and allow:
        detail = f"{path} does not take {method or 'this method'}; it takes {allow}"
    err = ServiceError(detail, headers=dict(exc.headers) if exc.headers else None)
    err.status = exc.status_code
    err.code = "http_" + str(exc.status_code)
    err.title = str(exc.detail)
    if exc.status_code == 413:
        return BodyTooLarge(str(exc.detail))
    return err


def to_service_error(
    exc: Exception, path: str = "", body: Any = None, method: str = ""
) -> ServiceError:
    """Map any exception the app may see to a service error (the one mapping); ``path``: the
    request's, for a 404 that can say what was meant; ``body``: its route's body model."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, RequestValidationError):
        return _validation(exc, body)
    if isinstance(exc, AttributionError):
        return from_engine(exc)
    if isinstance(exc, HTTPException):
        return _http(exc, path, method)
    # anything else is a bug: the client learns only the request id, the log has the rest
    return ServiceError(f"internal error (request id {request_id.get() or 'unknown'})")


def install(app: FastAPI) -> None:
    """Route every error class through ``problem``."""

    async def handle(request: Request, exc: Exception) -> ProblemResponse:
        if isinstance(exc, RequestValidationError) and request.method in ("POST", "PUT"):
            # FastAPI reads a body as JSON only with that content type: say so, not "not an object"
            given = request.headers.get("content-type", "")
            media = given.partition(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                shown = f"got {given!r}" if given else "none was sent"
                exc = MalformedRequest(
                    f"send the JSON body with Content-Type: application/json ({shown})",
                    loc=("header", "content-type"),
                )
        route = request.scope.get("route")
        field = getattr(route, "body_field", None)
        body = getattr(getattr(field, "field_info", None), "annotation", None)
        err = to_service_error(exc, request.url.path, body, request.method)
        return problem(err, request.url.path)

    # Exception: Starlette raises it again after this answer; service.http.middleware logs it
    for cls in (ServiceError, RequestValidationError, AttributionError, HTTPException, Exception):
        app.add_exception_handler(cls, handle)
