"""Health and metrics: always open, never authenticated."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response

from service.http.responses import OrjsonResponse
from service.http.routing import OPEN, declare
from service.http.state import AppState, get_state
from service.wire.catalog import Health

router = APIRouter()
State = Annotated[AppState, Depends(get_state)]


@router.get("/v1/health/live", response_model=Health, tags=["health"], operation_id="live")
@declare(OPEN)
async def live() -> OrjsonResponse:
    """The process is up."""
    return OrjsonResponse({"status": "ok"})


@router.get(
    "/v1/health/ready",
    operation_id="ready",
    response_model=Health,
    tags=["health"],
    responses={503: {"model": Health, "description": "no model is ready"}},
)
@declare(OPEN)
async def ready(state: State) -> OrjsonResponse:
    """200 while at least one model is ready, else 503 (the workers starting, every model
    failed, or the server draining for shutdown). ``status`` is "ready" when every model is,
    "degraded" when some are not; ``models`` gives each model's state, the reason and its
    worker group, ``workers`` each worker process."""
    pool = state.pool
    ok = pool.ready
    workers = pool.status()
    state.telemetry.workers_ready.set(sum(w["state"] in ("ready", "busy") for w in workers))
    models = pool.states()
    served = [m for m in models.values() if m["state"] != "unloaded"]
    if pool.draining:
        status = "draining"
    elif not ok:
        status = "not_ready"
    else:
        status = "ready" if all(m["state"] == "ready" for m in served) else "degraded"
    body = {"status": status, "ready": ok, "workers": workers, "models": models}
    return OrjsonResponse(body, status_code=200 if ok else 503)


@router.get(
    "/metrics",
    operation_id="metrics",
    tags=["health"],
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}},
)
@declare(OPEN)
async def metrics(state: State) -> Response:
    """Prometheus metrics: requests, latency, queue depth, merged batch sizes, restarts."""
    state.telemetry.workers_ready.set(
        sum(w["state"] in ("ready", "busy") for w in state.pool.status())
    )
    state.telemetry.queue_depth.set(state.pool.queue_depth())
    return Response(state.telemetry.render(), media_type="text/plain; version=0.0.4")
