"""``POST /v1/models/{model_id}/context-attributions`` (CONTRACT 8.3): which part of the
context supports each sentence of a language model's answer (ContextCite's ablations and
sparse surrogate, ``methods.attribute_context``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from service.contexts import serving
from service.contexts.protocol import ContextRequest, ContextResponse
from service.core.context import request_id
from service.http.headers import Deadline
from service.http.observed import ERRORS, Observed, until_disconnect
from service.http.responses import OrjsonResponse
from service.http.routing import OrjsonRoute
from service.http.state import AppState, get_state

router = APIRouter(tags=["generation"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
EXAMPLES: dict[str, dict[str, Any]] = {
    "rag": {
        "summary": "Which retrieved sentence supports the answer?",
        "value": {
            "context": "alice lives in paris. bob lives in rome. the sky is blue.",
            "query": "where does alice live?",
            "answer": "alice lives in paris.",
            "n_ablations": 32,
        },
    }
}


@router.post(
    "/v1/models/{model_id}/context-attributions",
    operation_id="contextAttributions",
    response_model=ContextResponse,
    responses=ERRORS,
)
async def context_attributions(
    model_id: str,
    request: Request,
    state: State,
    body: Annotated[ContextRequest, Body(openapi_examples=EXAMPLES)],
    x_deadline_ms: Deadline = None,
) -> OrjsonResponse:
    """For each sentence of the answer (given, or the model's greedy answer), the context's
    units ranked by how much keeping them raises the sentence's log-probability: the answer is
    scored after n_ablations random subsets of the units, and a sparse linear surrogate
    (Lasso) is fitted per sentence. fit.r2 is its held-out R²: where it is low, the ranking is
    not to be trusted."""
    with Observed(state, request.scope, model_id, "context_attribution") as seen:
        spec = state.serving(model_id)
        out = await serving.attribute(
            state.settings,
            state.pool,
            spec,
            body,
            x_deadline_ms,
            seen.started,
            request_id.get(),
            lambda: until_disconnect(request.receive),
        )
        seen.computed(out["timing_ms"]["compute"])
        return OrjsonResponse(out)
