"""Health and metrics: always open, never authenticated."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from service.http.responses import OrjsonResponse
from service.http.state import AppState, get_state
from service.wire.catalog import Health

router = APIRouter()
State = Annotated[AppState, Depends(get_state)]


@router.get("/v1/health/live", response_model=Health, tags=["health"], operation_id="live")
async def live() -> OrjsonResponse:
    """The process is up."""
    return OrjsonResponse({"status": "ok"})


@router.get(
    "/v1/health/ready",
    operation_id="ready",
    response_model=Health,
    tags=["health"],
    responses={503: {"model": Health, "description": "a worker is not ready"}},
)
async def ready(state: State) -> OrjsonResponse:
    """200 once every worker has loaded its models and every model passed its checks, else
    503 (a worker starting, restarting after a crash or a missed heartbeat, the server
    draining for shutdown, or a model refused by its device check: ``models`` says why)."""
    ok = state.pool.ready
    state.telemetry.workers_ready.set(
        sum(w["state"] in ("ready", "busy") for w in state.pool.status())
    )
    status = "ready" if ok else ("draining" if state.pool.draining else "not_ready")
    body: dict[str, object] = {"status": status, "ready": ok, "workers": state.pool.status()}
    refused = state.pool.unready_models()
    if refused:
        body["models"] = refused
    return OrjsonResponse(body, status_code=200 if ok else 503)


@router.get(
    "/metrics",
    operation_id="metrics",
    tags=["health"],
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
async def metrics(state: State) -> Response:
    """Prometheus metrics: requests, latency, queue depth, merged batch sizes, restarts."""
    state.telemetry.workers_ready.set(
        sum(w["state"] in ("ready", "busy") for w in state.pool.status())
    )
    state.telemetry.queue_depth.set(state.pool.queue_depth())
    return Response(state.telemetry.render(), media_type="text/plain; version=0.0.4")
