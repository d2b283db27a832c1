"""A model's training-data influence (CONTRACT 7.4): ``POST /v1/models/{model_id}/influence``
and ``GET /v1/models/{model_id}/influence/self?k=``, answered from its influence index."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from service.core.errors import NotReady
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.influence import serving
from service.influence.indexes import INDEX_BUILD, InfluenceIndexes
from service.influence.protocol import SelfInfluence
from service.influence.serving import INFLUENCE
from service.jobs import routes
from service.wire.catalog import Problem

router = APIRouter(tags=["influence"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (INFLUENCE, INDEX_BUILD)
State = Annotated[AppState, Depends(get_state)]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": why}
    for code, why in (
        (400, "malformed body"),
        (404, "unknown model, or a model that serves no influence"),
        (409, "the model's influence index is still building (or failed)"),
        (422, "inputs or labels the model cannot take, k over the training set"),
        (429, "queue full (Retry-After)"),
        (503, "not ready, worker lost, or shutting down (Retry-After)"),
        (504, "deadline passed (the work is stopped)"),
    )
}


def _indexes(state: AppState) -> InfluenceIndexes:
    if state.influence is None:
        raise NotReady("this server runs no workers; influence needs them")
    return state.influence


routes.operation(
    router,
    INFLUENCE,
    operation_id="influence",
    responses=ERRORS,
    description="The training examples that most helped (proponents) and, with ``opponents``, "
    "most hindered each example's loss, by the models.toml ``influence`` method, from the "
    "index built once over the training set: one ``{indices, scores}`` per example.",
)
routes.jobs(router, INFLUENCE)


@router.get(
    "/v1/models/{model_id}/influence/self",
    operation_id="selfInfluence",
    response_model=SelfInfluence,
    responses=ERRORS,
)
async def self_influence(
    model_id: str,
    state: State,
    k: Annotated[int, Query(ge=1, le=100_000, description="how many to list")] = 20,
    include_examples: Annotated[
        bool, Query(description="each listed example also carries its inputs and label")
    ] = False,
) -> OrjsonResponse:
    """The training examples of highest self-influence (each one's influence on its own
    loss): the likely mislabeled or atypical ones, highest first."""
    spec = state.spec(model_id)
    indexes = _indexes(state)
    found = indexes.self_influence(spec, k)
    method = indexes.states[spec.id].info.get("method")
    body = {"model_id": spec.id, "method": method, **found}
    if include_examples:
        body["examples"] = await serving.examples_of(spec, found["indices"])
    return OrjsonResponse(body)
