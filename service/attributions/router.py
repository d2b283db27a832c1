"""POST /v1/models/{model_id}/attributions, and its picture: POST .../attributions:render."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request, Response

from service.attributions import fastpath, streaming
from service.attributions.serving import ATTRIBUTIONS
from service.core.context import request_id
from service.core.offload import large
from service.http.headers import Deadline
from service.http.observed import ERRORS, until_disconnect
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute, Policy, declare
from service.http.state import AppState, get_state
from service.jobs import routes
from service.serving import pictures
from service.wire.attributions import (
    EXAMPLES,
    AttributionRequest,
    AttributionResponse,
    RenderSpec,
)

router = APIRouter(tags=["attributions"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (ATTRIBUTIONS,)
State = Annotated[AppState, Depends(get_state)]
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
    return size.isdigit() and large(int(size))


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
    if picture is None and streaming.wanted(request.headers.get("accept")):
        return await streaming.stream(
            state, model_id, request, body, x_deadline_ms, request_id.get()
        )
    picture = picture or pictures.accepted(request.headers.get("accept"))
    if picture is not None:
        drawing = (body.render or RenderSpec()).model_copy(update={"format": picture})
        drawing._single = True
        body = body.model_copy(update={"render": drawing})
    result = await ATTRIBUTIONS.serve(
        state,
        request.scope,
        model_id,
        body,
        deadline_ms=x_deadline_ms,
        request_id=request_id.get(),
        disconnected=lambda: until_disconnect(request.receive),
        offload=offload,
    )
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
            "/v1/models/{model_id}/attributions:render`) documents it. On a generative "
            "language model, `Accept: text/event-stream` streams the answer as it is "
            'attributed: an event `token` (`{"index", "token", "attr": [per feature]}`) per '
            "answer token, then `result` (this body) or `error` (a problem object); hanging "
            "up stops the work"
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


routes.jobs(router, ATTRIBUTIONS, tags=["jobs"])
