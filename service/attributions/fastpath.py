"""The hot route, ``POST /v1/models/{model_id}/attributions``, served without FastAPI's machinery.

Why: with batching on, the server process's CPU per request is what caps throughput on a small
machine, and most of it went to FastAPI's generic request path (its middleware, matching every
route, solving dependencies, validating the body through a generic field), several times what
the route's own work costs. The route declares ``attributions``
below as its fast handler (``service.http.routing.Policy.fast``), which the app calls in front of
all that: it serves the common case directly, a JSON object
body that validates, running the route's own ``serve`` with the same request model, so answers,
metrics and errors raised while serving are the route's, through the same problem mapping.

Measured (``python -m benchmarks.load --servers on,route``, 2 cores, one worker, batching on):
tabular-mlp IG at 16 clients, 2015 req/s with this path against 964 req/s through the FastAPI
route alone (tabular saliency 1441 against 919). It earns its keep, so it stays; it sits inside
the same pure-ASGI middleware as every route (``service.http.middleware``: request id and access
log, the route found once, body limit, API keys), so nothing the other routes get is skipped here.

Anything else (bad JSON, another content type, a body or header that does not validate, a client
that disconnects mid-body) goes on to FastAPI with the body replayed, so every validation error
keeps FastAPI's exact problem+json. The route stays declared there too, which keeps the OpenAPI
document as it was.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.core.errors import ServiceError
from service.core.offload import large, offload_if
from service.http import headers as declared
from service.http.problems import HANDLED, problem, to_service_error
from service.http.routing import FastHandler, read_body, replay
from service.wire.attributions import AttributionRequest
from service.wire.json import parse_json

#: the route's work once the body is valid: ``(state, model_id, request, body, deadline,
#: offload)`` (``service.attributions.router.serve``)
Serve = Callable[[Any, str, Request, AttributionRequest, float | None, bool], Awaitable[Response]]


def attributions(serve: Serve) -> FastHandler:
    """The attribution route's fast handler: valid requests straight to ``serve``, the rest
    to FastAPI (``fallback``) with the body replayed."""

    async def fast(
        state: Any,
        fallback: ASGIApp,
        params: dict[str, str],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        messages, body = await read_body(receive)
        off = large(None if body is None else len(body))
        try:  # parsing megabytes takes the loop's time from everyone else: off it
            parsed = (
                None if body is None else await offload_if(off, _parse, Headers(scope=scope), body)
            )
        except ServiceError as exc:
            await problem(exc, scope["path"])(scope, receive, send)
            return
        if parsed is None:
            await fallback(scope, replay(messages, receive), send)
            return
        request = Request(scope, receive)
        try:
            response = await serve(state, params["model_id"], request, *parsed, off)
        except Exception as exc:
            # as FastAPI's exception middlewares do: the one problem mapping answers; what is
            # not an expected error class (a 500) is raised again after, for the server's log
            if not isinstance(exc, HANDLED):
                raise  # the request-context middleware logs it and answers 500
            await problem(to_service_error(exc), scope["path"])(scope, receive, send)
            return
        await response(scope, receive, send)

    return fast


def _parse(headers: Headers, body: bytes) -> tuple[AttributionRequest, float | None] | None:
    """The validated body and deadline header, or None where FastAPI must decide (and answer)."""
    content_type = headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() != "application/json":
        return None
    try:
        data = parse_json(body)
    except ValueError:  # bad JSON: FastAPI's own 400 says where
        return None
    if not isinstance(data, dict):
        return None
    try:
        req = AttributionRequest.model_validate(data)
        return req, declared.deadline(headers.get(declared.DEADLINE_HEADER))
    except (ValidationError, ServiceError):
        return None
