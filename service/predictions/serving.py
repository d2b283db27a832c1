"""Predictions as a capability: ``POST /v1/models/{model_id}/predictions`` answers every
example's prediction and explains only those whose prediction meets ``explain_if`` (SageMaker
Clarify's ``EnableExplanations``), in one call: the backend's common case costs one forward.

The request is an attributions request (the same checks, the same method params) plus the
condition; the method defaults to the model's default explanation (models.toml ``explain``)
and the target to each example's predicted class. The work runs in one visit to the worker
(``service.predictions.work``)."""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service import kinds
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Work, retyped
from service.kinds.attribution import AttributionKind, build_attribution
from service.predictions.protocol import PredictionsRequest, PredictionsResponse
from service.predictions.work import PredictExplain, compiled
from service.serving.capability import Capability, Done
from service.wire import codec

#: request fields an answer of predictions does not carry
REFUSED = {
    "render": "pictures are drawn by the attributions route",
    "metrics": "metrics are computed by the attributions route",
    "verify": "verify with the attributions route",
}


class Predictions(Capability[PredictionsRequest]):
    """``POST /v1/models/{model_id}/predictions``: predict every example, explain some."""

    operation = "predictions"
    stem = "prediction"
    request = PredictionsRequest
    response = PredictionsResponse
    job_operation_id = "submitPredictionsJob"

    def method(self, req: PredictionsRequest) -> str:
        return req.method or ""

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: PredictionsRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        kind = kinds.of(spec)
        task = task_of(spec)
        if not isinstance(kind, AttributionKind) or task.targets not in ("classes", "none"):
            raise UnsupportedMethod(
                f"model {spec.id!r} is a {task.name} model: predictions answer classifiers and "
                "regressions (a label and a probability per example)",
                loc=("path", "model_id"),
            )
        for name, why in REFUSED.items():
            if getattr(req, name) not in (None, False):
                raise InvalidRequest(f"{name}: {why}", loc=("body", name))
        if req.explain_if is not None:
            compiled(req.explain_if)  # a 422 naming explain_if before any work
        update: dict[str, Any] = {}
        if req.method is None:  # the model's default explanation
            explanation = kind.catalogue(spec).explanation
            update["method"] = explanation.method
            if "params" not in req.model_fields_set:
                update["params"] = dict(explanation.params)
        method = str(update.get("method", req.method))
        update["params"] = kinds.with_defaults(spec, method, update.get("params", req.params))
        if req.target is None and task.targets == "classes":
            update["target"] = "predicted"  # what an explanation of a prediction explains
        areq = req.model_copy(update=update)  # an attributions request, with its condition
        work = build_attribution(kind.rules, settings, spec, areq, deadline, request_id)
        out = cast(PredictExplain, retyped(work, PredictExplain))
        out.explain_if = req.explain_if
        out.key = None  # the condition chooses among this request's examples: never merged
        return out

    def answer(self, done: Done) -> dict[str, Any]:
        reply, spec = done.reply, done.spec
        study = reply.study or {}
        chosen: list[int] = study.get("chosen", [])
        work = done.work
        explanations: list[dict[str, Any] | None] = [None] * work.n
        parts = reply.attributions
        for j, i in enumerate(chosen):
            one: dict[str, Any] = {
                "attributions": _one([p[j] for p in parts], reply.as_tuple),
                "target": None if reply.target is None else reply.target[j],
            }
            if reply.tokens is not None:
                one["tokens"] = reply.tokens[i]
            if reply.delta is not None:
                delta = np.asarray(reply.delta).reshape(len(chosen), -1)
                one["convergence_delta"] = float(delta[j, 0])
            if reply.base_values is not None:
                one["base_value"] = np.asarray(reply.base_values)[j].tolist()
            explanations[i] = one
        return {
            "model_id": spec.id,
            "model_version": spec.version,
            "method": getattr(work, "method", None) if chosen else None,
            "explain_if": getattr(work, "explain_if", None),
            "predictions": study.get("predictions", []),
            "explanations": explanations,
            "explained": len(chosen),
            "timing_ms": done.timing_ms,
        }


def _one(parts: list[np.ndarray], as_tuple: bool) -> Any:
    """One example's attributions: an array, or one per input."""
    encoded = [codec.encode_tensor(p, "json") for p in parts]
    return encoded if as_tuple else encoded[0]


PREDICTIONS = Predictions()
