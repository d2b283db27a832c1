"""Pure ASGI middleware every request passes, in this order: request id, access log and the
route found once (``service.http.routing.RouteTable``), body limit, API key. They wrap the whole app
(every route), run before any body is read, and read the route's own declaration (its
``Policy``), never a pattern of its path.
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
from service.http.routing import RouteTable, found, route_info

#: a caller's X-Request-ID is kept if it is this (printable ASCII, the space included, at
#: most 128 characters)
CALLER_ID = re.compile(r"[\x20-\x7e]{1,128}")


def route_template(scope: Scope) -> str | None:
    """The request's route as a template (a span's name), e.g. ``/v1/models/{model_id}``."""
    return found(scope).template


class RequestContext:
    """``X-Request-ID`` (the caller's, else the trace id) and ``traceresponse`` (the caller's
    ``traceparent`` continued, or a new trace; ``service.core.tracing``) on every response, one
    access-log line per request, and a problem+json 500 carrying only the request id for
    anything unexpected."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access: bool,
        traces: tracing.Tracing | None = None,
        routes: RouteTable | None = None,
    ) -> None:
        self.app = app
        self.access = access
        #: the app's routes: each request's is found once, here, for every layer inside
        self.routes = routes
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
        if self.routes is not None:
            info["route"] = self.routes.find(scope)
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
                        "attrserve.operation": info.get("operation"),
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
                    "operation": info.get("operation"),
                    "method": info.get("method"),
                    "status": status or 499,
                    "ms": round((time.perf_counter() - started) * 1e3, 3),
                }
                access_log.info(orjson.dumps(line).decode())


class ApiKeys:
    """401 without a valid key, 403 for a model the key may not use: from the headers and the
    route's declaration alone (open routes take no key; a route with a ``model_id`` checks
    that model), before any body is read or parsed."""

    def __init__(self, app: ASGIApp, settings: Any) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.settings.keys:
            await self.app(scope, receive, send)
            return
        route = found(scope)
        if route.policy.keyed:
            try:
                key = authenticate(self.settings, Headers(scope=scope))
                model_id = route.params.get("model_id")
                if model_id is not None:
                    authorize(key, model_id, self.settings)
            except ServiceError as err:
                await problem(err, scope["path"])(scope, receive, send)
                return
            route_info(scope)["api_key"] = key
        await self.app(scope, receive, send)
