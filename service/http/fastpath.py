"""The hot route, ``POST /v1/models/{model_id}/attributions``, served without FastAPI's machinery.

Why: with batching on, the server process's CPU per request is what caps throughput on a small
machine, and most of it went to FastAPI's generic request path (its middleware, matching every
route, solving dependencies, validating the body through a generic field), several times what
the route's own work costs. ``AttrServe`` (the app) hands this route's requests to
``FastAttributions`` in front of all that: it serves the common case directly, a JSON object
body that validates, running the route's own ``serve`` with the same request model, so answers,
metrics and errors raised while serving are the route's, through the same problem mapping.

Measured (``python -m benchmarks.load --servers on,route``, 2 cores, one worker, batching on):
tabular-mlp IG at 16 clients, 2015 req/s with this path against 964 req/s through the FastAPI
route alone (tabular saliency 1441 against 919). It earns its keep, so it stays; it sits inside
the same pure-ASGI middleware as every route (``service.http.middleware``: request id and access
log, body limit, API keys), so nothing the other routes get is skipped here.

Anything else (bad JSON, another content type, a body or header that does not validate, a client
that disconnects mid-body) goes on to FastAPI with the body replayed, so every validation error
keeps FastAPI's exact problem+json. The route stays declared there too, which keeps the OpenAPI
document as it was.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Annotated

from pydantic import Field, TypeAdapter, ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import ServiceError
from service.core.offload import OFFLOAD_BYTES, offload
from service.http.problems import HANDLED, problem, to_service_error
from service.http.routes import compat
from service.http.routes.attributions import serve
from service.http.state import AppState
from service.wire.attributions import AttributionRequest
from service.wire.json import parse_json

#: the route's path, as Starlette compiles ``/v1/models/{model_id}/attributions``
ROUTE = re.compile(r"/v1/models/(?P<model_id>[^/]+)/attributions")
#: the route's ``X-Deadline-Ms`` header parameter
DEADLINE = TypeAdapter(Annotated[float | None, Field(gt=0)])


def model_id_of(scope: Scope) -> str | None:
    """The model id if this is a request for the attribution route, else None."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return None
    match = ROUTE.fullmatch(scope["path"])
    return None if match is None else match["model_id"]


def takes(scope: Scope) -> bool:
    """Whether the fast path serves this request: the attribution route, or a raw
    compatibility route (``service.http.routes.compat``)."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
        return False
    return ROUTE.fullmatch(scope["path"]) is not None or compat.match(scope) is not None


class FastAttributions:
    """ASGI app: valid attribution requests straight to ``serve``, the rest to ``fallback``."""

    def __init__(self, fallback: ASGIApp, state: AppState) -> None:
        self.fallback = fallback
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        model_id = model_id_of(scope)
        if model_id is None:
            raw = compat.match(scope)
            if raw is None:
                await self.fallback(scope, receive, send)
            else:
                await self._raw(*raw, scope, receive, send)
            return
        messages, body = await _read_body(receive)
        large = body is not None and len(body) > OFFLOAD_BYTES
        try:
            if body is None:
                parsed = None
            elif large:  # parsing megabytes takes the loop's time from everyone else
                parsed = await offload(_parse, Headers(scope=scope), body)
            else:
                parsed = _parse(Headers(scope=scope), body)
        except ServiceError as exc:
            await problem(exc, scope["path"])(scope, receive, send)
            return
        if parsed is None:
            await self.fallback(scope, _replay(messages, receive), send)
            return
        request = Request(scope, receive)
        try:
            response = await serve(self.state, model_id, request, *parsed, offload=large)
        except Exception as exc:
            # as FastAPI's exception middlewares do: the one problem mapping answers; what is
            # not an expected error class (a 500) is raised again after, for the server's log
            if not isinstance(exc, HANDLED):
                raise  # the request-context middleware logs it and answers 500
            await problem(to_service_error(exc), scope["path"])(scope, receive, send)
            return
        await response(scope, receive, send)

    async def _raw(
        self,
        handler: compat.Handler,
        params: dict[str, str],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """A compatibility route: its handler answers everything, errors included."""
        _, body = await _read_body(receive)
        if body is None:  # the client went away before sending its body
            return
        response = await handler(self.state, Request(scope, receive), params, body)
        await response(scope, receive, send)


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The messages read and the whole body; None for the body if the client went away."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives back the messages already read, then reads on."""
    pending = deque(messages)

    async def replayed() -> Message:
        return pending.popleft() if pending else await receive()

    return replayed


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
        return AttributionRequest.model_validate(data), DEADLINE.validate_python(
            headers.get("x-deadline-ms")
        )
    except ValidationError:
        return None
