"""Context attribution in the worker: the request's fields to ``methods.attribute_context``,
after the exact limits on tokens (the server checked words, a lower bound)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import methods
from methods.errors import AttributionCancelled, AttributionError, ModelError
from methods.generation import units as units_
from methods.generation.context import check_template, encode_prompt
from methods.generation.features import encode
from model_registry.spec import LoadedModel
from service.core.errors import LimitExceeded, Loc
from service.core.work import Reply, Work, runs
from service.wire.engine_errors import from_engine

#: where each argument of attribute_context sits in the body
WHERE: dict[str, Loc] = {
    name: ("body", name)
    for name in (
        "context", "query", "answer", "units", "unit_pattern", "n_ablations", "seed",
        "keep_prob", "prompt_template", "score", "alpha", "gen_args", "perturbations_per_eval",
    )
}  # fmt: skip
WHERE["target"] = ("body", "context")  # the prompt and answer over the model's positions


@dataclass(kw_only=True)
class ContextQuery(Work):
    """Which units of the context support each answer sentence."""

    label: ClassVar[str] = "context_attribution"

    #: attribute_context's arguments (context, query, answer, units, ...) as checked
    request: dict[str, Any] = field(default_factory=dict)
    #: the exact limits: prompt tokens, answer tokens, cost in token evaluations
    limits: dict[str, int] = field(default_factory=dict)


@runs(ContextQuery)
def run(lm: LoadedModel, work: ContextQuery) -> Reply:
    t0 = time.perf_counter()
    r = work.request
    try:
        _check_tokens(lm, work)
        res = methods.attribute_context(lm.model, lm.text_tokenizer, **r)
    except (ModelError, AttributionCancelled):
        raise
    except AttributionError as exc:
        raise from_engine(exc, work.request_id, WHERE) from None
    return Reply(
        work_id=work.id,
        compute_ms=(time.perf_counter() - t0) * 1e3,
        study={
            "units": res.units,
            "answer": res.answer,
            "answer_sentences": res.answer_sentences,
            "answer_spans": [list(span) for span in res.answer_spans],
            "scores": res.scores.tolist(),
            "top": res.top,
            "fit": res.fit,
            "intercepts": res.intercepts.tolist(),
            "masks": res.masks.long().tolist(),
            "params": res.params,
            "stats": res.stats,
        },
    )


def _check_tokens(lm: LoadedModel, work: ContextQuery) -> None:
    """The prompt built from the whole context, the given answer, and the cost, in tokens."""
    r, lim = work.request, work.limits
    tokenizer = lm.text_tokenizer
    parts = units_.split(r["context"], r.get("units", "sentences"), r.get("unit_pattern"))
    template = check_template(r.get("prompt_template"))
    prompt = len(encode_prompt(tokenizer, template.format(context=parts.join(), query=r["query"])))
    if prompt > lim["prompt"]:
        raise LimitExceeded(
            f"the prompt built from the whole context has {prompt} tokens; this server takes "
            f"at most {lim['prompt']} (ATTRSERVE_MAX_CONTEXT_TOKENS)",
            loc=("body", "context"),
        )
    if r.get("answer") is not None:
        answer = len(encode(tokenizer, r["answer"], add_special_tokens=False))
    else:
        answer = (r.get("gen_args") or {}).get("max_new_tokens", 64)
    if answer > lim["answer"]:
        raise LimitExceeded(
            f"the answer has {answer} tokens; this server takes at most {lim['answer']}",
            loc=("body", "answer"),
        )
    cost = r["n_ablations"] * (prompt + answer)
    if cost > lim["cost"]:
        raise LimitExceeded(
            f"this request would cost about {cost} token evaluations (ablations x (prompt + "
            f"answer tokens)); the limit is {lim['cost']}: use fewer ablations or a shorter "
            "context",
            loc=("body", "n_ablations"),
        )
