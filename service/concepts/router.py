"""A model's concept sets and TCAV (CONTRACT 7.1): ``PUT|GET|DELETE
/v1/models/{model_id}/concepts/{name}``, ``GET .../concepts``, ``POST .../tcav``."""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response

from service.concepts import serving
from service.concepts.protocol import (
    ConceptInfo,
    ConceptList,
    ConceptPut,
    ConceptSet,
)
from service.concepts.serving import TCAV_OPERATION
from service.core.offload import offload as in_thread
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state
from service.jobs import routes
from service.wire.catalog import Problem

router = APIRouter(tags=["concepts"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (TCAV_OPERATION,)
State = Annotated[AppState, Depends(get_state)]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": why}
    for code, why in (
        (400, "malformed body"),
        (404, "unknown model or concept set"),
        (413, "body over the limit"),
        (422, "a bad name, inputs the model cannot take, an unknown layer, bad params"),
        (429, "queue full (Retry-After)"),
        (503, "not ready, worker lost, or shutting down (Retry-After)"),
        (504, "deadline passed (the work is stopped)"),
    )
}
TCAV_EXAMPLES: dict[str, dict[str, Any]] = {
    "striped": {
        "summary": "Does image-cnn's class 1 lean on stripes? (sets stored with PUT first)",
        "value": {
            "inputs": [[[[0.0] * 8] * 8]],
            "target": 1,
            "concepts": ["stripes"],
            "random_concepts": ["random-0", "random-1", "random-2"],
            "layers": ["features.1"],
        },
    }
}


@router.put(
    "/v1/models/{model_id}/concepts/{name}",
    operation_id="putConcept",
    response_model=ConceptInfo,
    status_code=201,
    responses={200: {"description": "the set was replaced", "model": ConceptInfo}, **ERRORS},
)
async def put_concept(model_id: str, name: str, state: State, body: ConceptPut) -> Response:
    """Store (201) or replace (200) a concept's example inputs; CAVs built on the old
    contents are not used again (they are cached by the contents' digest)."""
    spec = state.known(model_id)
    meta, created = await in_thread(partial(serving.put, state.settings, spec, name, body.inputs))
    return OrjsonResponse(meta, status_code=201 if created else 200)


@router.get(
    "/v1/models/{model_id}/concepts",
    operation_id="listConcepts",
    response_model=ConceptList,
    responses=ERRORS,
)
async def list_concepts(model_id: str, state: State) -> OrjsonResponse:
    """The model's concept sets: name, examples, shape, when written."""
    spec = state.known(model_id)
    return OrjsonResponse({"concepts": serving.listing(state.settings, spec)})


@router.get(
    "/v1/models/{model_id}/concepts/{name}",
    operation_id="getConcept",
    response_model=ConceptSet,
    responses=ERRORS,
)
async def get_concept(model_id: str, name: str, state: State) -> OrjsonResponse:
    """One set: its description and its examples."""
    spec = state.known(model_id)
    return OrjsonResponse(await in_thread(partial(serving.read, state.settings, spec, name)))


@router.delete(
    "/v1/models/{model_id}/concepts/{name}",
    operation_id="deleteConcept",
    status_code=204,
    response_class=Response,
    responses=ERRORS,
)
async def delete_concept(model_id: str, name: str, state: State) -> Response:
    """Remove the set (its cached CAVs stay until the model's cache is cleared)."""
    spec = state.known(model_id)
    serving.delete(state.settings, spec, name)
    return Response(status_code=204)


routes.operation(
    router,
    TCAV_OPERATION,
    operation_id="tcav",
    examples=TCAV_EXAMPLES,
    responses=ERRORS,
    description="TCAV scores of the named concept sets at the layers, for the target on the "
    "inputs: one row per (concept, layer) with the sign count, magnitude, per-random-set "
    "counts, p-value and significance. Activations and CAVs are cached, so a repeated query "
    "only computes the inputs' gradients.",
)
routes.jobs(router, TCAV_OPERATION)
