"""The hot route, ``POST /v1/models/{model_id}/attributions``, served without FastAPI's machinery.

Why: with batching on, the server process's CPU per request is what caps throughput on a small
machine, and most of it went to FastAPI's generic request path (matching every route, solving
dependencies, validating the body through a generic field, two exception middlewares), several
times what the route's own work costs. This ASGI middleware serves the common case directly: a
JSON object body that validates, on exactly that route. It runs the route's own ``serve`` with
the same request model, so answers, metrics and errors raised while serving are the route's.

Anything else (another path or method, another content type, bad JSON, a body or header that
does not validate, a client that disconnects mid-body) goes on to FastAPI with the body replayed,
so every validation error keeps FastAPI's exact problem+json. The route stays declared there
too, which keeps the OpenAPI document as it was.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Annotated

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import Field, TypeAdapter, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from methods.errors import AttributionError
from service.errors import ServiceError
from service.problems import problem, to_service_error
from service.protocol.attributions import AttributionRequest
from service.routers.attributions import serve
from service.state import AppState

#: the route's path, as Starlette compiles ``/v1/models/{model_id}/attributions``
ROUTE = re.compile(r"/v1/models/(?P<model_id>[^/]+)/attributions")
#: the route's ``X-Deadline-Ms`` header parameter
DEADLINE = TypeAdapter(Annotated[float | None, Field(gt=0)])
#: what FastAPI's exception middleware answers (the rest reaches its server-error middleware)
HANDLED = (ServiceError, RequestValidationError, AttributionError, HTTPException)


class FastAttributions:
    """ASGI middleware: valid attribution requests straight to ``serve``, the rest to FastAPI."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = None
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = ROUTE.fullmatch(scope["path"])
        if match is None:
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        parsed = None if body is None else _parse(Headers(scope=scope), body)
        if parsed is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        request = Request(scope, receive)
        try:
            response = await serve(self.state, match["model_id"], request, *parsed)
        except HANDLED as exc:
            response = problem(to_service_error(exc), request.url.path)
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
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    try:
        return AttributionRequest.model_validate(data), DEADLINE.validate_python(
            headers.get("x-deadline-ms")
        )
    except ValidationError:
        return None
