"""``POST /v1/models/{model_id}/dependence`` and its job route (CONTRACT §9.6): partial
dependence and ICE curves of a tabular model."""

from __future__ import annotations

from fastapi import APIRouter

from service.dependence.serving import DEPENDENCE
from service.http.routing import OrjsonRoute
from service.jobs import routes

router = APIRouter(tags=["dependence"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (DEPENDENCE,)

routes.operation(
    router,
    DEPENDENCE,
    operation_id="dependence",
    description="How a tabular model's output moves as each of ``features`` sweeps its grid "
    "(the rows' distinct values, or ``grid_resolution`` points between their "
    "``percentiles``), the other features as each row has them: partial dependence "
    "(``average``), each row's ICE curve (``individual``) or both, equal to scikit-learn's "
    "``partial_dependence(method='brute')``; one batched forward of grid x rows.",
    examples={
        "two_features": {
            "summary": "Partial dependence of tabular-mlp's class 'high' on features 0 and 3",
            "value": {
                "inputs": [
                    [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
                    [-0.5, 0.1, 0.0, -0.2, 0.3, 0.2, -0.1, 0.4],
                ],
                "features": [0, 3],
                "target": "high",
                "grid_resolution": 10,
            },
        }
    },
)
routes.jobs(router, DEPENDENCE)
