"""POST /v1/models/{model_id}/attributions."""

from __future__ import annotations

import base64
import time
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Request, Response
from starlette.types import Receive, Scope

from service.core.context import request_id
from service.core.offload import OFFLOAD_BYTES
from service.core.work import PREDICT
from service.http.middleware import route_info
from service.http.problems import to_service_error
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
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


@router.post(
    "/v1/models/{model_id}/attributions",
    operation_id="attribute",
    response_model=AttributionResponse,
    response_class=OrjsonResponse,
    responses={
        200: {
            "description": "the attributions; with Accept: image/png or text/html (and one "
            "example to draw), the picture itself",
            "content": {
                "image/png": {"schema": {"type": "string", "format": "binary"}},
                "text/html": {"schema": {"type": "string"}},
            },
        },
        **ERRORS,
    },
)
async def attribute(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[AttributionRequest, Body(openapi_examples=EXAMPLES)],
    x_deadline_ms: Annotated[
        float | None, Header(gt=0, description="deadline in ms (overrides the body's)")
    ] = None,
) -> Response:
    """Compute attributions for a batch of examples with one method."""
    size = request.headers.get("content-length", "")
    offload = size.isdigit() and int(size) > OFFLOAD_BYTES
    return await serve(state, model_id, request, body, x_deadline_ms, offload)


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
        known = method in state.method_names or method == PREDICT
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
) -> Response:
    """The route's work once the body is valid (shared with ``service.http.fastpath``). With
    ``Accept: image/png`` (or ``text/html``) the answer is the one picture itself."""
    picture = pictures.accepted(request.headers.get("accept"))
    if picture is not None:
        drawing = (body.render or RenderSpec()).model_copy(update={"format": picture})
        drawing._single = True
        body = body.model_copy(update={"render": drawing})
    with Observed(state, request.scope, model_id, body.method) as seen:
        spec = state.spec(model_id)
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
