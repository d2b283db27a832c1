"""Extractive question answering (CONTRACT 9.4): a tensor model of token ids whose output is
``[start, end, span]`` per example (``model_registry.hf_qa``), so every method of a token
model attributes it, as Captum's BERT SQuAD tutorial does; what this kind adds is its inputs
(``{"question", "context"}`` objects, as the tokenizer's text pairs), its default target (the
span) and its answers (the context's best span, with its character offsets), in every answer
and job result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from model_registry.hf_qa import answers
from model_registry.spec import LoadedModel, ModelSpec
from service.core.errors import InvalidRequest
from service.core.settings import Settings
from service.core.work import Attribution, Prediction, Reply, Work, retyped, runs
from service.kinds import tensors
from service.kinds.attribution import AttributionRules, build_attribution
from service.kinds.base import Catalogue
from service.kinds.tensor import TensorKind, attribute, predict
from service.wire.attributions import AttributionRequest

LOC = ("body", "inputs")


@dataclass(kw_only=True)
class Answering(Attribution):
    """Attributions of a question-answering model, answered with the answers."""

    label: ClassVar[str] = "attribution"


@dataclass(kw_only=True)
class Answers(Prediction):
    """A question-answering model's predictions: its answers."""


class AnsweringRules(AttributionRules):
    work = Answering


def pairs(raw: Any) -> list[list[str]]:
    """``[{"question", "context"}, ...]`` (or ``[question, context]`` pairs) as text pairs; a
    422 naming the example and the field that is missing or empty."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest(
            'a question-answering model takes [{"question": "...", "context": "..."}, ...]',
            loc=LOC,
        )
    out = []
    for i, item in enumerate(raw):
        if isinstance(item, list) and len(item) == 2:
            item = {"question": item[0], "context": item[1]}
        if not isinstance(item, dict):
            raise InvalidRequest(
                'each example is {"question": "...", "context": "..."}; a question alone has '
                "no context to find its answer in",
                loc=(*LOC, i),
            )
        unknown = sorted(set(item) - {"question", "context"})
        if unknown:
            raise InvalidRequest(
                f"unknown fields {unknown}; an example is {{question, context}}",
                loc=(*LOC, i, unknown[0]),
            )
        for name in ("question", "context"):
            value = item.get(name)
            if not isinstance(value, str) or not value.strip():
                got = "missing" if name not in item else f"got {value!r}"[:80]
                raise InvalidRequest(
                    f"{name} must be a non-empty text ({got})", loc=(*LOC, i, name)
                )
        out.append([item["question"], item["context"]])
    return out


class QuestionAnsweringKind(TensorKind):
    name = "question_answering"
    rules = AnsweringRules()

    def describe(self, spec: ModelSpec) -> Catalogue:
        return Catalogue(
            methods=super().describe(spec).methods,
            explanation=super().describe(spec).explanation,
            target="span",
            tokenizer=True,
            pictures=1,
            example_fields=("question", "context"),
        )

    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Attribution:
        req = req.model_copy(update={"inputs": pairs(req.inputs)})
        return build_attribution(self.rules, settings, spec, req, deadline, request_id)

    def predict_work(
        self, settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str
    ) -> Prediction:
        work = super().predict_work(settings, spec, pairs(inputs), deadline, request_id)
        return retyped(work, Answers)


def _answered(lm: LoadedModel, work: Work, reply: Reply) -> Reply:
    """``reply`` with each example's answer (``study["answers"]``, one per example)."""
    xs, _ = tensors.inputs(lm, work)
    tokenizer = getattr(lm.tokenizer, "tokenizer", None)
    reply.study = {"answers": answers(lm.model, tokenizer, xs[0], work.texts)}
    reply.study_rows = ["answers"]
    return reply


@runs(Answering)
def attribute_answering(lm: LoadedModel, work: Answering) -> Reply:
    return _answered(lm, work, attribute(lm, work))


@runs(Answers)
def predict_answers(lm: LoadedModel, work: Answers) -> Reply:
    return _answered(lm, work, predict(lm, work))
