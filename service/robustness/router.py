"""Attacks and counterfactuals (CONTRACT 7.2): ``POST /v1/models/{model_id}/attacks`` and
``POST /v1/models/{model_id}/counterfactuals``."""

from __future__ import annotations

import math
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request

from service.core.errors import InvalidRequest
from service.http.headers import Deadline
from service.http.observed import ERRORS, Observed
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.jobs.protocol import JobInfo
from service.jobs.router import JOB_SUBMIT_ERRORS, accepted, owner, runner
from service.robustness import serving
from service.robustness.protocol import (
    ATTACK_EXAMPLES,
    COUNTERFACTUAL_EXAMPLES,
    AttackRequest,
    AttackResponse,
    CounterfactualRequest,
    CounterfactualResponse,
)
from service.robustness.work import Attack, Counterfactual

router = APIRouter(tags=["robustness"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]


async def _serve(
    state: AppState,
    request: Request,
    model_id: str,
    body: AttackRequest | CounterfactualRequest,
    x_deadline_ms: float | None,
) -> OrjsonResponse:
    method = (Attack if isinstance(body, AttackRequest) else Counterfactual).label
    with Observed(state, request.scope, model_id, method) as seen:
        spec = state.serving(model_id)
        out = await serving.perturb(
            state.settings, state.pool, spec, body, x_deadline_ms, seen.started
        )
        seen.computed(out["timing_ms"]["compute"])
        return OrjsonResponse(out)


@router.post(
    "/v1/models/{model_id}/attacks",
    operation_id="attack",
    response_model=AttackResponse,
    responses=ERRORS,
)
async def attack(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[AttackRequest, Body(openapi_examples=ATTACK_EXAMPLES)],
    x_deadline_ms: Deadline = None,
) -> OrjsonResponse:
    """FGSM or PGD on a batch: the perturbed inputs, the model's output on them and whether
    each example's top class changed, and whether its loss's gradient was zero so that it
    could not move (pictures of the perturbation with ``render``)."""
    return await _serve(state, request, model_id, body, x_deadline_ms)


@router.post(
    "/v1/models/{model_id}/counterfactuals",
    operation_id="counterfactual",
    response_model=CounterfactualResponse,
    responses=ERRORS,
)
async def counterfactual(
    model_id: str,
    state: State,
    request: Request,
    body: Annotated[CounterfactualRequest, Body(openapi_examples=COUNTERFACTUAL_EXAMPLES)],
    x_deadline_ms: Deadline = None,
) -> OrjsonResponse:
    """Per example, the least perturbation (noise, an FGSM or PGD budget, features removed
    most important first) that changes the model's answer, found by a linear or binary
    search: ``min_param`` (null where nothing in range does), the perturbed inputs, the
    model's output on them."""
    return await _serve(state, request, model_id, body, x_deadline_ms)


async def _submit(
    state: AppState, request: Request, model_id: str, body: AttackRequest | CounterfactualRequest
) -> OrjsonResponse:
    spec = state.serving(model_id)
    if body.render is not None:
        raise InvalidRequest(
            "render draws pictures in synchronous answers; jobs return tensors",
            loc=("body", "render"),
        )
    size = len(await request.body())
    build = partial(serving.build_job, spec=spec, req=body, deadline=math.inf)
    row = await runner(state).submit_work(owner(request), spec, build, size)
    return accepted(row)


@router.post(
    "/v1/models/{model_id}/attack-jobs",
    operation_id="submitAttackJob",
    status_code=202,
    response_model=JobInfo,
    responses=JOB_SUBMIT_ERRORS,
)
async def submit_attack_job(
    model_id: str, state: State, request: Request, body: Annotated[AttackRequest, Body()]
) -> OrjsonResponse:
    """Queue an attack on many examples as a job (checked now, run in chunks, persisted;
    ``GET /v1/jobs/{job_id}/result`` answers as the attacks route does)."""
    return await _submit(state, request, model_id, body)


@router.post(
    "/v1/models/{model_id}/counterfactual-jobs",
    operation_id="submitCounterfactualJob",
    status_code=202,
    response_model=JobInfo,
    responses=JOB_SUBMIT_ERRORS,
)
async def submit_counterfactual_job(
    model_id: str, state: State, request: Request, body: Annotated[CounterfactualRequest, Body()]
) -> OrjsonResponse:
    """Queue a counterfactual search on many examples as a job (as attack-jobs)."""
    return await _submit(state, request, model_id, body)
