"""``GET /v1/jobs/{job_id}/summary``: a finished attribution job's attributions aggregated
per label (``service.summaries.serving``), as JSON or, with ``?format=png``, a bar chart of one
label's features, largest first."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request, Response

from service.core.errors import Conflict, InvalidRequest
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.jobs.router import JOB_ERRORS, job_row, runner
from service.serving import render
from service.serving.profiles import summarize
from service.wire.attributions import RenderSpec
from service.wire.catalog import Problem

router = APIRouter(tags=["jobs"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
#: the features a bar chart draws at most
TOP = 20


@router.get(
    "/v1/jobs/{job_id}/summary",
    operation_id="getJobSummary",
    responses={
        **JOB_ERRORS,
        200: {
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "image/png": {},
            },
            "description": '`{"job_id", "model_id", "method", "examples", "agg", "labels": '
            '{label: {"examples", "features", "values", "ranking"[, "counts"]}}}`; with '
            "`?format=png` a bar chart of one label's largest features",
        },
        409: {"model": Problem, "description": "the job has not succeeded (yet)"},
        422: {"model": Problem, "description": "not an attribution job, or an unknown label"},
    },
)
async def get_job_summary(
    job_id: str,
    state: State,
    request: Request,
    agg: Annotated[
        Literal["mean_abs", "mean", "median", "mean_sq", "std"],
        Query(description="how each feature's values over a label's examples are aggregated"),
    ] = "mean_abs",
    format: Annotated[Literal["json", "png"], Query(description="json or png")] = "json",
    label: Annotated[
        str | None, Query(description="png: the label drawn (default: the one of most examples)")
    ] = None,
) -> Response:
    """Which features drive the model overall: a finished attribution job's attributions
    aggregated per label of its targets (``agg``: ``mean_abs``, ``mean``, ``median``,
    ``mean_sq``, ``std``), ranked largest first; token models by token text."""
    row = job_row(state, request, job_id)
    if row.status != "succeeded":
        raise Conflict(
            f"job {job_id} is {row.status}; it is summarised once it has succeeded",
            loc=("path", "job_id"),
        )
    if row.operation != "attributions":
        raise InvalidRequest(
            f"a summary aggregates attributions; job {job_id} is a {row.operation} job",
            loc=("path", "job_id"),
        )
    spec = state.spec(row.model_id)
    body = await asyncio.to_thread(runner(state).result, row)
    summary = await asyncio.to_thread(summarize, spec, body, agg)
    head = {"job_id": job_id, "model_id": row.model_id, "method": body.get("method")}
    if format == "json":
        return OrjsonResponse({**head, **summary})
    png = await asyncio.to_thread(_chart, summary, label, f"{row.model_id} · {body.get('method')}")
    return Response(png, media_type="image/png")


def _chart(summary: dict[str, Any], label: str | None, title: str) -> bytes:
    """One label's largest features (``TOP``) as a bar chart."""
    labels = summary["labels"]
    if label is None:
        label = max(labels, key=lambda k: labels[k]["examples"])
    elif label not in labels:
        raise InvalidRequest(
            f"label {label!r} has no examples in this job; its labels are {sorted(labels)}",
            loc=("query", "label"),
        )
    part = labels[label]
    top = part["ranking"][:TOP]
    values = np.asarray(part["values"], dtype=np.float64)[top]
    names = [str(part["features"][i]) for i in top]
    agg = summary["agg"]
    signed = agg in ("mean", "median")  # the others are never negative
    spec = RenderSpec(sign="all" if signed else "positive", width=640)
    try:
        drawn = render.draw(spec, values, feature_names=names,
                            title=f"{title} · {label} · {agg} of {part['examples']}")  # fmt: skip
    except render.RenderError as exc:
        raise InvalidRequest(
            f"the summary cannot be drawn: {exc}", loc=("query", "format")
        ) from None
    return drawn.data
