"""POST /v1/models/{model_id}/attributions."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Request
from starlette.types import Receive

from service.context import request_id
from service.middleware import route_info
from service.problems import to_service_error
from service.protocol.attributions import EXAMPLES, AttributionRequest, AttributionResponse
from service.protocol.catalog import Problem
from service.responses import OrjsonResponse
from service.routing import OFFLOAD_BYTES, OrjsonRoute
from service.serving import attributions
from service.state import AppState, get_state

router = APIRouter(tags=["attributions"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
#: declared as application/problem+json with the Problem schema (service.openapi_doc)
ERRORS = {
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
    responses=ERRORS,  # type: ignore[arg-type]
)
async def attribute(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[AttributionRequest, Body(openapi_examples=EXAMPLES)],
    x_deadline_ms: Annotated[
        float | None, Header(gt=0, description="deadline in ms (overrides the body's)")
    ] = None,
) -> OrjsonResponse:
    """Compute attributions for a batch of examples with one method."""
    size = request.headers.get("content-length", "")
    offload = size.isdigit() and int(size) > OFFLOAD_BYTES
    return await serve(state, model_id, request, body, x_deadline_ms, offload)


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body is read: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def serve(
    state: AppState,
    model_id: str,
    request: Request,
    body: AttributionRequest,
    x_deadline_ms: float | None,
    offload: bool = False,
) -> OrjsonResponse:
    """The route's work once the body is valid (shared with ``service.fastpath``)."""
    started = time.perf_counter()
    tel = state.telemetry
    status = 200
    info = route_info(request.scope)
    info["model"] = model_id if model_id in state.specs else "_unknown"
    info["method"] = body.method if body.method in state.method_names else "_unknown"
    try:
        spec = state.spec(model_id)
        result, _ = await attributions.attribute(
            state.settings,
            state.pool,
            spec,
            body,
            x_deadline_ms,
            started,
            request_id=request_id.get(),
            disconnected=lambda: until_disconnect(request.receive),
            offload=offload,
        )
        compute = result["timing_ms"]["compute"] / 1e3
        tel.labels(tel.compute, model_id, body.method).observe(compute)
        return OrjsonResponse(result)
    except Exception as exc:
        status = to_service_error(exc).status
        raise
    finally:
        # label values come from the catalogue only, never from free user text
        model, method = info["model"], info["method"]
        tel.labels(tel.requests, model, method, str(status)).inc()
        tel.labels(tel.latency, model, method).observe(time.perf_counter() - started)
