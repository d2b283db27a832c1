"""Context attributions through the pool: the request checked without the model (its kind,
the units, the template, limits on words as a lower bound of tokens), run in the model's worker
(``service.contexts.work``), and the answer shaped."""

from __future__ import annotations

from typing import Any

from methods.errors import AttributionError
from methods.generation import units as units_
from methods.generation.context import check_template
from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service.contexts.protocol import ContextRequest, ContextResponse
from service.contexts.settings import ContextSettings
from service.contexts.work import WHERE, ContextQuery
from service.core.errors import LimitExceeded, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Work, new_id
from service.serving.capability import Capability, Done
from service.wire.engine_errors import from_engine


def build(
    settings: Settings, spec: ModelSpec, req: ContextRequest, deadline: float, request_id: str
) -> ContextQuery:
    """Every check that needs no model: the request as work, or a 4xx ServiceError."""
    own = settings.section(ContextSettings)
    kind = task_of(spec).family
    if not task_of(spec).supports(ContextAttributions.operation):
        raise UnsupportedMethod(
            f"model {spec.id!r} ({kind}) does not write answers; context attributions serve "
            "generative language models (kind causal_lm)",
            loc=("path", "model_id"),
        )
    if req.answer is not None and req.gen_args is not None:
        raise UnsupportedMethod(
            "gen_args apply only when the answer is generated (answer null)",
            loc=("body", "gen_args"),
        )
    try:
        parts = units_.split(req.context, req.units, req.unit_pattern)
        check_template(req.prompt_template)
    except AttributionError as exc:
        raise from_engine(exc, request_id, WHERE) from None
    if len(parts) > own.max_context_units:
        raise LimitExceeded(
            f"the context has {len(parts)} units; this server attributes to at most "
            f"{own.max_context_units} (ATTRSERVE_MAX_CONTEXT_UNITS): use larger units",
            loc=("body", "context"),
        )
    if req.n_ablations > settings.max_n_samples:
        raise LimitExceeded(
            f"n_ablations {req.n_ablations} is over this server's limit of "
            f"{settings.max_n_samples}",
            loc=("body", "n_ablations"),
        )
    # words are a lower bound of tokens: refuse what is surely over, before any work
    words = len(parts.join().split()) + len(req.query.split())
    if words > own.max_context_tokens:
        raise LimitExceeded(
            f"the context and query have {words} words; this server takes prompts of at most "
            f"{own.max_context_tokens} tokens (ATTRSERVE_MAX_CONTEXT_TOKENS)",
            loc=("body", "context"),
        )
    new_tokens = req.gen_args.max_new_tokens if req.gen_args is not None else 64
    answer = len(req.answer.split()) if req.answer is not None else new_tokens
    if answer > own.max_answer_tokens:
        raise LimitExceeded(
            f"the answer has {answer} {'words' if req.answer is not None else 'tokens'}; this "
            f"server takes at most {own.max_answer_tokens} tokens "
            "(ATTRSERVE_MAX_ANSWER_TOKENS)",
            loc=("body", "answer" if req.answer is not None else "gen_args"),
        )
    cost = req.n_ablations * (words + answer)
    if cost > settings.max_cost:
        raise LimitExceeded(
            f"this request would cost at least {cost} token evaluations (ablations x (prompt + "
            f"answer)); the limit is {settings.max_cost}: use fewer ablations or a shorter "
            "context",
            loc=("body", "n_ablations"),
        )
    request = req.model_dump(exclude={"return_masks", "deadline_ms"})
    request["gen_args"] = req.gen_args.model_dump() if req.gen_args is not None else None
    return ContextQuery(
        id=new_id(),
        model_id=spec.id,
        n=1,
        cost=cost,
        deadline=deadline,
        request_id=request_id,
        request=request,
        limits={
            "prompt": own.max_context_tokens,
            "answer": own.max_answer_tokens,
            "cost": settings.max_cost,
        },
    )


class ContextAttributions(Capability[ContextRequest]):
    """``POST /v1/models/{model_id}/context-attributions``: which units of the context
    support each sentence of the answer."""

    operation = "context-attributions"
    stem = "context-attribution"
    request = ContextRequest
    response = ContextResponse
    job_operation_id = "submitContextAttributionJob"
    section = ContextSettings

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: ContextRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        return build(settings, spec, req, deadline, request_id)

    def offloaded(self, spec: ModelSpec, req: ContextRequest) -> bool:
        return False  # texts split into units: no files, no images

    def options(self, req: ContextRequest, work: Work) -> dict[str, Any]:
        return {"return_masks": req.return_masks}

    def answer(self, done: Done) -> dict[str, Any]:
        out = dict(done.reply.study or {})
        masks = out.pop("masks", None)
        return {
            "model_id": done.spec.id,
            "model_version": done.spec.version,
            **out,
            "masks": masks if done.options.get("return_masks") else None,
            "timing_ms": done.timing_ms,
        }


CONTEXT_ATTRIBUTIONS = ContextAttributions()
