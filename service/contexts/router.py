"""``POST /v1/models/{model_id}/context-attributions`` (CONTRACT 8.3): which part of the
context supports each sentence of a language model's answer (ContextCite's ablations and
sparse surrogate, ``methods.attribute_context``); and its job route,
``context-attribution-jobs``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.contexts.serving import CONTEXT_ATTRIBUTIONS
from service.http.routing import OrjsonRoute
from service.jobs import routes

router = APIRouter(tags=["generation"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (CONTEXT_ATTRIBUTIONS,)
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

routes.operation(
    router,
    CONTEXT_ATTRIBUTIONS,
    operation_id="contextAttributions",
    examples=EXAMPLES,
    description="For each sentence of the answer (given, or the model's greedy answer), the "
    "context's units ranked by how much keeping them raises the sentence's log-probability: "
    "the answer is scored after n_ablations random subsets of the units, and a sparse linear "
    "surrogate (Lasso) is fitted per sentence. fit.r2 is its held-out R²: where it is low, "
    "the ranking is not to be trusted.",
)
routes.jobs(router, CONTEXT_ATTRIBUTIONS)
