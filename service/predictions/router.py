"""``POST /v1/models/{model_id}/predictions`` (CONTRACT §9.6): predictions for every example,
attributions where ``explain_if`` holds."""

from __future__ import annotations

from fastapi import APIRouter

from service.http.routing import OrjsonRoute
from service.jobs import routes
from service.predictions.serving import PREDICTIONS

router = APIRouter(tags=["predictions"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (PREDICTIONS,)

routes.operation(
    router,
    PREDICTIONS,
    operation_id="predictAndExplain",
    description="Every example's prediction (label, class, probability, output) and, only "
    "where ``explain_if`` (a JMESPath expression over the prediction) is true, its "
    "attributions by ``method`` (default: the model's default explanation): one call, and "
    "one forward when no example needs explaining.",
    examples={
        "explain_the_unsure": {
            "summary": "Explain the predictions of tabular-mlp under 60% sure",
            "value": {
                "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
                "explain_if": "probability < `0.6`",
                "method": "integrated_gradients",
            },
        }
    },
)
