"""POST /v1/models/{model_id}/attributions, and its picture: POST .../attributions:render."""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response
from starlette.types import Receive, Scope

from service.core.context import request_id
from service.core.offload import OFFLOAD_BYTES
from service.core.work import PREDICT, STUDIES
from service.http import fastpath
from service.http.headers import Deadline
from service.http.problems import to_service_error
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute, Policy, declare, route_info
from service.http.state import AppState, get_state
from service.serving import attributions, pictures
from service.wire.attributions import (
    EXAMPLES,
    AttributionRequest,
    AttributionResponse,
    RenderSpec,
)
from service.wire.catalog import Problem

router = APIRouter(tags=["attributions"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
#: declared as application/problem+json with the Problem schema (service.http.openapi_doc)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        400: "malformed body",
        404: "unknown model or method",
        413: "body over the limit",
        422: "cannot be served (shape, dtype, NaN, target, method, limits)",
        429: "queue full (Retry-After)",
        503: "not ready, worker lost, or shutting down (Retry-After)",
        504: "deadline passed (the work is stopped)",
    }.items()
}


#: the picture's media types, as the render operation declares them
PICTURE: dict[str, Any] = {
    "image/png": {"schema": {"type": "string", "format": "binary"}},
    "text/html": {"schema": {"type": "string"}},
}
PICTURE_EXAMPLES: dict[str, dict[str, Any]] = {
    "tabular_bars": {
        "summary": "A bar chart of integrated gradients' scores on tabular-mlp (PNG)",
        "value": {
            "method": "integrated_gradients",
            "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
            "target": 1,
        },
    },
    "text_html": {
        "summary": "Tokens highlighted by their scores on text-classifier (HTML)",
        "value": {
            "method": "integrated_gradients",
            "inputs": ["a wonderful film"],
            "target": "positive",
            "render": {"format": "html", "sign": "all"},
        },
    },
}


# One media type per operation: a client generator types a response by all of its media types
# (openapi-fetch's `data` became JSON | string), so the picture is its own operation, and the
# plain route's Accept negotiation (curl's way, CONTRACT 6.4) is told in words only.
def _large(request: Request) -> bool:
    """Whether the body is large enough to decode off the event loop."""
    size = request.headers.get("content-length", "")
    return size.isdigit() and int(size) > OFFLOAD_BYTES


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body is read: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Observed:
    """One model request's metrics (count by status, latency, compute) and access-log labels;
    label values come from the catalogue only, never from free user text."""

    def __init__(self, state: AppState, scope: Scope, model_id: str, method: str) -> None:
        self.tel = state.telemetry
        self.started = time.perf_counter()
        info = route_info(scope)
        known = method in state.method_names or method in (PREDICT, *STUDIES)
        self.model = info["model"] = model_id if model_id in state.specs else "_unknown"
        self.method = info["method"] = method if known else "_unknown"

    def __enter__(self) -> Observed:
        return self

    def computed(self, ms: float) -> None:
        self.tel.labels(self.tel.compute, self.model, self.method).observe(ms / 1e3)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        status = 200
        if isinstance(exc, Exception):
            status = to_service_error(exc).status
        elif exc is not None:
            status = 499
        tel = self.tel
        tel.labels(tel.requests, self.model, self.method, str(status)).inc()
        tel.labels(tel.latency, self.model, self.method).observe(time.perf_counter() - self.started)


async def serve(
    state: AppState,
    model_id: str,
    request: Request,
    body: AttributionRequest,
    x_deadline_ms: float | None,
    offload: bool = False,
    picture: str | None = None,
) -> Response:
    """The routes' work once the body is valid (the route's and its fast handler's). With
    ``picture`` ("png", "html"; by default what an ``Accept: image/png`` or ``text/html`` header
    asks for) the answer is the one picture itself."""
    picture = picture or pictures.accepted(request.headers.get("accept"))
    if picture is not None:
        drawing = (body.render or RenderSpec()).model_copy(update={"format": picture})
        drawing._single = True
        body = body.model_copy(update={"render": drawing})
    with Observed(state, request.scope, model_id, body.method) as seen:
        spec = state.serving(model_id)
        result, _, _ = await attributions.attribute(
            state.settings,
            state.pool,
            spec,
            body,
            x_deadline_ms,
            seen.started,
            request_id=request_id.get(),
            disconnected=lambda: until_disconnect(request.receive),
            offload=offload,
        )
        seen.computed(result["timing_ms"]["compute"])
        if picture is not None:
            (one,) = result["renders"]
            return Response(
                base64.b64decode(one["b64"]),
                media_type=one["media_type"],
                headers={"X-Attrserve-Method": result["method"]},
            )
        return OrjsonResponse(result)


@router.post(
    "/v1/models/{model_id}/attributions",
    operation_id="attribute",
    response_model=AttributionResponse,
    response_class=OrjsonResponse,
    responses={
        200: {
            "description": "the attributions. With `Accept: image/png` or `text/html` (and "
            "one example to draw) the picture itself, as `render` (`POST "
            "/v1/models/{model_id}/attributions:render`) documents it"
        },
        **ERRORS,
    },
)
@declare(Policy(fast=fastpath.attributions(serve)))
async def attribute(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[AttributionRequest, Body(openapi_examples=EXAMPLES)],
    x_deadline_ms: Deadline = None,
) -> Response:
    """Compute attributions for a batch of examples with one method."""
    return await serve(state, model_id, request, body, x_deadline_ms, _large(request))


@router.post(
    "/v1/models/{model_id}/attributions:render",
    operation_id="render",
    response_class=Response,
    responses={200: {"description": "the picture", "content": PICTURE}, **ERRORS},
)
async def render(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[AttributionRequest, Body(openapi_examples=PICTURE_EXAMPLES)],
    x_deadline_ms: Deadline = None,
) -> Response:
    """Compute attributions for one example and answer their picture: `render.format` (png
    unless given; an `Accept: image/png` or `text/html` header wins), drawn as `render` says."""
    picture = pictures.accepted(request.headers.get("accept"))
    picture = picture or (body.render or RenderSpec()).format
    return await serve(state, model_id, request, body, x_deadline_ms, _large(request), picture)
