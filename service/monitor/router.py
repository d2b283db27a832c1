"""``PUT``, ``GET`` and ``DELETE /v1/models/{model_id}/monitor`` (CONTRACT §9.6): an attribution
drift monitor per model: its reference profile, the live window of what it serves, and the
nDCG of their rankings per label (``service.monitor.serving``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.core.context import request_id
from service.core.errors import InvalidRequest, NotFound, NotReady
from service.http.observed import ERRORS, until_disconnect
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.jobs.router import owner, runner
from service.monitor.protocol import InputsReference, MonitorRequest, MonitorState
from service.monitor.serving import REFERENCE, check_request, served_rows, set_gauge
from service.monitor.store import Monitor, Monitors
from service.serving.profiles import flat_rows, per_label
from service.wire.catalog import Problem

router = APIRouter(tags=["monitor"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and stops them)
OPERATIONS = (REFERENCE,)
State = Annotated[AppState, Depends(get_state)]
NO_MONITOR: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "unknown model, or no monitor on it"},
}


def _store(state: AppState) -> Monitors:
    if state.monitors is None:
        raise NotReady("this server runs no workers; monitors need them")
    store: Monitors = state.monitors["store"]
    return store


async def _reference(
    state: AppState, request: Request, model_id: str, req: MonitorRequest
) -> tuple[Any, list[str], list[str], dict[str, Any]]:
    """The reference's flat rows, labels, feature names and where they came from."""
    spec = state.healthy(model_id)
    ref = req.reference
    if isinstance(ref, InputsReference):
        done = await REFERENCE.run(
            state.settings, state.pool, spec, ref, started=time.perf_counter(),
            request_id=request_id.get(),
            disconnected=lambda: until_disconnect(request.receive),
        )  # fmt: skip
        found = served_rows(spec, done.reply)
        if found is None:
            raise InvalidRequest(
                "a monitor compares fixed features per example; these attributions have none",
                loc=("body", "reference"),
            )
        work = done.work
        return (*found, {"inputs": work.n, "method": getattr(work, "method", None)})
    jobs = runner(state)
    row = jobs.get(owner(request), ref.job)  # the caller's jobs only
    if row is None:
        raise NotFound(f"no job {ref.job!r}", loc=("body", "reference", "job"))
    if row.model_id != model_id:
        raise InvalidRequest(
            f"job {ref.job} attributed model {row.model_id!r}, not {model_id!r}: a reference "
            "profiles the model it monitors",
            loc=("body", "reference", "job"),
        )
    if row.status != "succeeded" or row.operation != "attributions":
        raise InvalidRequest(
            f"job {ref.job} is a {row.status} {row.operation} job; a reference is a succeeded "
            "attribution job",
            loc=("body", "reference", "job"),
        )
    body = await asyncio.to_thread(jobs.result, row)
    if body.get("tokens") is not None:
        raise InvalidRequest(
            "a monitor compares fixed features per example; this job's are tokens",
            loc=("body", "reference", "job"),
        )
    rows, labels, names = flat_rows(spec, body)
    return rows, labels, names, {"job": ref.job, "method": body.get("method")}


@router.put(
    "/v1/models/{model_id}/monitor",
    operation_id="setMonitor",
    response_model=MonitorState,
    responses={**ERRORS, **NO_MONITOR},
)
async def put_monitor(
    model_id: str, state: State, request: Request, body: MonitorRequest
) -> OrjsonResponse:
    """Start (or replace) the model's attribution drift monitor: its reference profile (a
    finished attribution job's, or rows attributed now), then every attribution it serves (a
    ``sample`` share) joins a window of the latest ``window`` examples."""
    store = _store(state)
    minimum = check_request(body)
    rows, labels, names, source = await _reference(state, request, model_id, body)
    monitor = Monitor(
        model_id=model_id, agg=body.agg, sample=body.sample, window=body.window,
        ndcg_threshold=body.ndcg_threshold, min_examples=minimum, features=names,
        reference={k: v.tolist() for k, v in per_label(rows, labels, body.agg).items()},
        source=source,
    )  # fmt: skip
    await asyncio.to_thread(store.put, monitor)
    return OrjsonResponse(monitor.state())


@router.get(
    "/v1/models/{model_id}/monitor",
    operation_id="getMonitor",
    response_model=MonitorState,
    responses=NO_MONITOR,
)
async def get_monitor(model_id: str, state: State) -> OrjsonResponse:
    """The monitor's status (``warming_up`` until ``min_examples``; ``violation`` where a
    label's nDCG is under the threshold), its nDCG per label, the profiles side by side."""
    state.known(model_id)
    monitor = _store(state).get(model_id)
    if monitor is None:
        raise NotFound(f"model {model_id!r} has no monitor", loc=("path", "model_id"))
    return OrjsonResponse(set_gauge(state.monitors["gauge"], monitor))


@router.delete(
    "/v1/models/{model_id}/monitor",
    operation_id="deleteMonitor",
    response_model=MonitorState,
    responses=NO_MONITOR,
)
async def delete_monitor(model_id: str, state: State) -> OrjsonResponse:
    """Stop the monitor (its files and its gauge go too); the answer is its last state."""
    state.known(model_id)
    monitor = await asyncio.to_thread(_store(state).delete, model_id)
    if monitor is None:
        raise NotFound(f"model {model_id!r} has no monitor", loc=("path", "model_id"))
    last = monitor.state()
    gauge = state.monitors["gauge"]
    for label in last["ndcg"]:
        with contextlib.suppress(KeyError):  # a label the gauge never showed
            gauge.remove(model_id, label)
    return OrjsonResponse(last)
