"""Attribution jobs (README, "Attribution jobs"): submit, status, result, cancel, list. Jobs
belong to the API key that submitted them: another key is told they do not exist (404)."""

from __future__ import annotations

import base64
import binascii
import io
import json
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Response

from service.core.errors import Conflict, InvalidRequest, NotFound
from service.http.middleware import route_info
from service.http.observed import ERRORS
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.jobs.protocol import JobInfo, JobList
from service.jobs.runner import JobRunner
from service.jobs.store import STATUSES, JobRow
from service.wire.catalog import Problem

#: a job in one of these states is done: DELETE removes it
FINISHED = ("succeeded", "failed", "cancelled")
router = APIRouter(tags=["jobs"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
JOB_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such job (for this API key)"},
}


JOB_SUBMIT_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    413: {"model": Problem, "description": "body over the job limit"},
    429: {"model": Problem, "description": "too many jobs queued (Retry-After)"},
    507: {"model": Problem, "description": "the jobs' disk budget is full"},
}


def runner(state: AppState) -> JobRunner:
    if state.jobs is None:
        raise NotFound("this server runs no attribution jobs")
    return state.jobs


def owner(request: Request) -> str:
    key = route_info(request.scope).get("api_key")
    return "" if key is None else str(key.owner)


def job_row(state: AppState, request: Request, job_id: str) -> JobRow:
    row = runner(state).get(owner(request), job_id)
    if row is None:
        raise NotFound(f"no job {job_id!r}", loc=("path", "job_id"))
    return row


def accepted(row: JobRow) -> OrjsonResponse:
    """A queued job's answer: 202, the job, and where to follow it."""
    return OrjsonResponse(row.public(), status_code=202, headers={"Location": f"/v1/jobs/{row.id}"})


@router.get(
    "/v1/jobs/{job_id}", operation_id="getJob", response_model=JobInfo, responses=JOB_ERRORS
)
async def get_job(job_id: str, state: State, request: Request) -> OrjsonResponse:
    """A job's status and progress (examples done of total)."""
    return OrjsonResponse(job_row(state, request, job_id).public())


@router.get(
    "/v1/jobs/{job_id}/result",
    operation_id="getJobResult",
    responses={
        **JOB_ERRORS,
        200: {
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/octet-stream": {},
            },
            "description": "the response body of the route the job answers as (its "
            "`operation`: the attributions route's for an attribution job, the tcav route's "
            "for a tcav job, ...), with `job_id`; or, with `?format=npz`, a .npz of its arrays",
        },
        409: {"model": Problem, "description": "the job has not succeeded (yet)"},
    },
)
async def get_job_result(
    job_id: str,
    state: State,
    request: Request,
    format: Annotated[Literal["json", "npz"], Query(description="json or npz")] = "json",
) -> Response:
    """The whole job's response (JSON: the body of the route it answers as, its
    ``operation``), or a .npz of its arrays (attributions, attacks, counterfactuals)."""
    row = job_row(state, request, job_id)
    if row.status != "succeeded":
        raise Conflict(
            f"job {job_id} is {row.status}; its result is there once it has succeeded",
            loc=("path", "job_id"),
        )
    import asyncio

    body = await asyncio.to_thread(runner(state).result, row)
    if format == "json":
        return OrjsonResponse(body)
    if "attributions" not in body and "perturbed" not in body:
        raise InvalidRequest(
            f"a {row.operation} job's result has no arrays to put in a .npz; ask format=json",
            loc=("query", "format"),
        )
    return Response(
        await asyncio.to_thread(_npz, body),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{job_id}.npz"'},
    )


def _npz(body: dict[str, Any]) -> bytes:
    """The result's arrays: attributions (``_<i>`` per input), outputs, convergence_delta;
    attacks and counterfactuals: perturbed, predictions."""
    arrays: dict[str, np.ndarray] = {}
    main = "perturbed" if "perturbed" in body else "attributions"
    attrs = body[main]
    if isinstance(attrs, list):
        for i, a in enumerate(attrs):
            arrays[f"{main}_{i}"] = a
    else:
        arrays[main] = attrs
    for name in ("outputs", "convergence_delta", "predictions"):
        if body.get(name) is not None:
            arrays[name] = body[name]
    if body.get("target") is not None:  # per example, as `attrserve attribute` writes it
        target = np.asarray(body["target"])
        if target.dtype == object:  # mixed forms: each as its JSON text
            target = np.asarray([json.dumps(t) for t in body["target"]])
        arrays["target"] = target
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


@router.delete(
    "/v1/jobs/{job_id}", operation_id="cancelJob", response_model=JobInfo, responses=JOB_ERRORS
)
async def cancel_job(job_id: str, state: State, request: Request) -> OrjsonResponse:
    """Cancel a queued or running job (running work stops within a second; the job stays
    listed, cancelled). A finished job (succeeded, failed or cancelled) is deleted with its
    result: afterwards GET answers 404 and the listing omits it. The answer is the job as it
    was."""
    row = runner(state).shown(job_row(state, request, job_id))
    if row.status in FINISHED:
        import asyncio

        await asyncio.to_thread(runner(state).delete, row)
        return OrjsonResponse(row.public())
    return OrjsonResponse(runner(state).cancel(row).public())


@router.get("/v1/jobs", operation_id="listJobs", response_model=JobList)
async def list_jobs(
    state: State,
    request: Request,
    status: Annotated[str | None, Query(description="only jobs with this status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(description="next_cursor of the previous page")] = None,
) -> OrjsonResponse:
    """The caller's jobs, newest first, a page at a time."""
    if status is not None and status not in STATUSES:
        raise InvalidRequest(
            f"status must be one of {', '.join(STATUSES)}", loc=("query", "status")
        )
    before = _cursor(cursor) if cursor else None
    rows = runner(state).store.page(owner(request), status, limit + 1, before)
    page, more = rows[:limit], len(rows) > limit
    next_cursor = None
    if more and page:
        last = page[-1]
        next_cursor = base64.urlsafe_b64encode(f"{last.created_at!r}|{last.id}".encode()).decode()
    shown = [runner(state).shown(r).public() for r in page]
    return OrjsonResponse({"jobs": shown, "next_cursor": next_cursor})


def _cursor(raw: str) -> tuple[float, str]:
    try:
        created, _, job_id = base64.urlsafe_b64decode(raw.encode()).decode().partition("|")
        return float(created), job_id
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest(
            "cursor is not one this server gave", loc=("query", "cursor")
        ) from None
