"""A capability's routes, declared: ``POST /v1/models/{model_id}/{operation}`` (the template's
``serve``) and its job route ``POST /v1/models/{model_id}/{stem}-jobs`` (``submit``), each with
its request and response models, examples and errors in the API document."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from service.core.context import request_id
from service.http.headers import Deadline
from service.http.observed import ERRORS, until_disconnect
from service.http.responses import OrjsonResponse
from service.http.routing import Policy, declare
from service.http.state import AppState, get_state
from service.jobs.protocol import JobInfo
from service.jobs.router import JOB_SUBMIT_ERRORS, accepted, owner
from service.serving.capability import Capability

State = Annotated[AppState, Depends(get_state)]
_P = inspect.Parameter.POSITIONAL_OR_KEYWORD
#: job routes take bodies up to the job limit
JOB_BODY = Policy(job_body=True)


def _signed(fn: Callable[..., Any], body: Any, deadline: bool) -> Callable[..., Any]:
    """``fn`` with the signature FastAPI reads: the path's model, the state, the request,
    the body of the capability's model (and the deadline header)."""
    params = [
        inspect.Parameter("model_id", _P, annotation=str),
        inspect.Parameter("state", _P, annotation=State),
        inspect.Parameter("request", _P, annotation=Request),
        inspect.Parameter("body", _P, annotation=body),
    ]
    if deadline:
        params.append(inspect.Parameter("x_deadline_ms", _P, annotation=Deadline, default=None))
    fn.__signature__ = inspect.Signature(params, return_annotation=OrjsonResponse)  # type: ignore[attr-defined]
    return fn


def operation(
    router: APIRouter,
    capability: Capability[Any],
    *,
    operation_id: str,
    description: str,
    examples: dict[str, dict[str, Any]] | None = None,
    responses: dict[int | str, dict[str, Any]] | None = None,
) -> None:
    """The capability's route: the body checked, served through the template."""

    async def route(
        model_id: str,
        state: AppState,
        request: Request,
        body: Any,
        x_deadline_ms: float | None = None,
    ) -> OrjsonResponse:
        out = await capability.serve(
            state,
            request.scope,
            model_id,
            body,
            deadline_ms=x_deadline_ms,
            request_id=request_id.get(),
            disconnected=lambda: until_disconnect(request.receive),
        )
        return OrjsonResponse(out)

    route.__doc__ = description
    route.__name__ = operation_id
    body = Annotated[capability.request, Body(openapi_examples=examples or {})]  # type: ignore[name-defined]
    router.add_api_route(
        f"/v1/models/{{model_id}}/{capability.operation}",
        _signed(route, body, deadline=True),
        methods=["POST"],
        operation_id=operation_id,
        summary=capability.operation.replace("-", " ").title(),
        response_model=capability.response,
        response_class=OrjsonResponse,
        responses=responses if responses is not None else ERRORS,
    )


def jobs(
    router: APIRouter, capability: Capability[Any], tags: list[str | Enum] | None = None
) -> None:
    """The capability's job route: the same body, checked now, queued (202); ``tags``: the
    API document's group, where not the router's."""

    async def submit(model_id: str, state: AppState, request: Request, body: Any) -> OrjsonResponse:
        size = len(await request.body())
        row = await capability.submit(state, owner(request), model_id, body, size)
        return accepted(row)

    submit.__doc__ = capability.job_summary or (
        f"Queue the {capability.operation} request as a job (checked now, run in chunks where "
        f"its examples are independent, persisted); ``GET /v1/jobs/{{job_id}}/result`` answers "
        f"as POST /v1/models/{{model_id}}/{capability.operation} does."
    )
    submit.__name__ = capability.job_operation_id
    router.add_api_route(
        f"/v1/models/{{model_id}}/{capability.stem}-jobs",
        declare(JOB_BODY)(_signed(submit, Annotated[capability.request, Body()], False)),
        methods=["POST"],
        operation_id=capability.job_operation_id,
        summary=f"Submit {capability.stem.replace('-', ' ').title()} Job",
        status_code=202,
        tags=tags,
        response_model=JobInfo,
        response_class=OrjsonResponse,
        responses=JOB_SUBMIT_ERRORS,
    )
