"""Pure ASGI middleware every request passes, in this order: request id and access log, body
limit, API key. They wrap the whole app (every route), and run before any body is read.
"""

from __future__ import annotations

import os
import re
import time
import traceback
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core import tracing
from service.core.context import access_log, error_log, request_id
from service.core.errors import ServiceError
from service.http.auth import authenticate, authorize
from service.http.problems import problem

#: a caller's X-Request-ID is kept if it is this (printable ASCII, at most 128 characters)
CALLER_ID = re.compile(r"[\x21-\x7e]{1,128}")
#: routes open without a key: health (ours and OIP's), OIP server metadata, metrics, the
#: API's own documentation, and the explorer's page and files (it asks for the key itself)
OPEN_PATHS = re.compile(r"/(|v[12]/health/.*|v2/?|metrics|docs.*|redoc|openapi\.json|ui(/.*)?)")
#: routes about one model (ours, KServe V1's ``:predict``, OIP's): the key must allow it
MODEL_PATH = re.compile(r"/v[12]/models/(?P<model_id>[^/:]+)(?:[/:].*)?")


def route_info(scope: Scope) -> dict[str, Any]:
    """Where a route leaves what the access log reports (model, method)."""
    state: dict[str, Any] = scope.setdefault("state", {})
    info: dict[str, Any] = state.setdefault("attrserve", {})
    return info


def route_template(scope: Scope) -> str | None:
    """The request's route as a template (a span's name): the route FastAPI matched, else a model
    route's path with the model id as ``{model_id}`` (the fast path's), else None."""
    path = getattr(scope.get("route"), "path", None)
    if isinstance(path, str):
        return path
    path = scope["path"]
    match = MODEL_PATH.fullmatch(path)
    if match is None:
        return None
    return f"{path[: match.start('model_id')]}{{model_id}}{path[match.end('model_id') :]}"


class RequestContext:
    """``X-Request-ID`` (the caller's, else the trace id) and ``traceresponse`` (the caller's
    ``traceparent`` continued, or a new trace; ``service.core.tracing``) on every response, one
    access-log line per request, and a problem+json 500 carrying only the request id for
    anything unexpected."""

    def __init__(
        self, app: ASGIApp, *, access: bool, traces: tracing.Tracing | None = None
    ) -> None:
        self.app = app
        self.access = access
        # spans when the OTEL_* variables ask (the SDK's own; read once, here at start)
        self.traces = traces or tracing.Tracing.from_environ(os.environ)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        headers = Headers(scope=scope)
        trace = self.traces.start(headers.getlist("traceparent"), scope["method"])
        given = headers.get("x-request-id", "")
        rid = given if CALLER_ID.fullmatch(given) else trace.trace_id
        token, trace_token = request_id.set(rid), tracing.current.set(trace)
        ours = {b"x-request-id": rid.encode(), b"traceresponse": trace.response.encode()}
        info = route_info(scope)
        info["request_id"] = rid
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k not in ours]
                headers.extend(ours.items())
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            error_log.error(
                "request %s: %s %s failed\n%s",
                rid,
                scope["method"],
                scope["path"],
                traceback.format_exc(),
            )
            if status == 0:
                err = ServiceError(f"internal error (request id {rid})")
                await problem(err, scope.get("path"))(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
            tracing.current.reset(trace_token)
            if trace.spans is not None:  # name and label the server span, only when it exists
                self.traces.finish(
                    trace,
                    route_template(scope),
                    status or 499,
                    {
                        "http.request.method": scope["method"],
                        "url.path": scope["path"],
                        "attrserve.request_id": rid,
                        "attrserve.model": info.get("model"),
                        "attrserve.method": info.get("method"),
                    },
                )
            if self.access:
                line = {
                    "request_id": rid,
                    "trace_id": trace.trace_id,
                    "http_method": scope["method"],
                    "path": scope["path"],
                    "model": info.get("model"),
                    "method": info.get("method"),
                    "status": status or 499,
                    "ms": round((time.perf_counter() - started) * 1e3, 3),
                }
                access_log.info(orjson.dumps(line).decode())


class ApiKeys:
    """401 without a valid key, 403 for a model the key may not use: from the headers alone,
    before any body is read or parsed."""

    def __init__(self, app: ASGIApp, settings: Any) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.settings.keys:
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if OPEN_PATHS.fullmatch(path) is None:
            try:
                key = authenticate(self.settings, Headers(scope=scope))
                match = MODEL_PATH.fullmatch(path)
                if match is not None:
                    authorize(key, match["model_id"], self.settings)
            except ServiceError as err:
                await problem(err, path)(scope, receive, send)
                return
            route_info(scope)["api_key"] = key
        await self.app(scope, receive, send)
