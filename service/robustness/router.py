"""Attacks and counterfactuals (CONTRACT 7.2): ``POST /v1/models/{model_id}/attacks`` and
``POST /v1/models/{model_id}/counterfactuals``, and their job routes (``attack-jobs``,
``counterfactual-jobs``)."""

from __future__ import annotations

from fastapi import APIRouter

from service.http.routing import OrjsonRoute
from service.jobs import routes
from service.robustness.protocol import ATTACK_EXAMPLES, COUNTERFACTUAL_EXAMPLES
from service.robustness.serving import ATTACKS, COUNTERFACTUALS

router = APIRouter(tags=["robustness"], route_class=OrjsonRoute)
#: the operations this folder serves (``service.app`` starts and lists them)
OPERATIONS = (ATTACKS, COUNTERFACTUALS)

routes.operation(
    router,
    ATTACKS,
    operation_id="attack",
    examples=ATTACK_EXAMPLES,
    description="FGSM or PGD on a batch: the perturbed inputs, the model's output on them and "
    "whether each example's top class changed, and whether its loss's gradient was zero so "
    "that it could not move (pictures of the perturbation with ``render``).",
)
routes.operation(
    router,
    COUNTERFACTUALS,
    operation_id="counterfactual",
    examples=COUNTERFACTUAL_EXAMPLES,
    description="Per example, the least perturbation (noise, an FGSM or PGD budget, features "
    "removed most important first) that changes the model's answer, found by a linear or "
    "binary search: ``min_param`` (null where nothing in range does), the perturbed inputs, "
    "the model's output on them.",
)
routes.jobs(router, ATTACKS)
routes.jobs(router, COUNTERFACTUALS)
