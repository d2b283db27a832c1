"""Model kinds as plug-ins: each family of model tasks the service serves is one module
implementing ``ModelKind`` (``service.kinds.base``), registered here by the family's name;
``of(spec)`` chooses it once, by the family the model's task names
(``model_registry.tasks.Task.family``). A new task served by a family is one record in
``model_registry.tasks``; a new family is one module and one line below.

- ``tensor``: tensors (or raw texts through a tokenizer) in, one tensor out: every method
  (tasks ``tensor`` and the Hugging Face classifiers');
- ``question_answering``: an extractive question-answering model (a token model answering
  ``{question, context}`` pairs with its answers);
- ``object_detection``: a detector, scored per wanted box and label;
- ``image_text``: image–text pairs (CLIP), their similarity attributed to both;
- ``exported``: a file computing one attribution (``attribution-export:``);
- ``causal_lm``: a generative language model: the prompt's part in an answer;
- ``seq2seq_lm``: an encoder-decoder (translation, summaries): the source's part in an answer.
"""

from __future__ import annotations

from typing import Any

from model_registry.spec import LoadedModel, ModelSpec
from model_registry.tasks import task_of
from service.core.errors import ServiceError
from service.core.settings import Settings
from service.core.work import Reply, Work
from service.core.work import run as run_work
from service.kinds.answering import QuestionAnsweringKind
from service.kinds.base import ModelKind
from service.kinds.causal_lm import CausalLMKind, Seq2SeqLMKind
from service.kinds.detection import DetectionKind
from service.kinds.exported import ExportedKind
from service.kinds.image_text import ImageTextKind
from service.kinds.tensor import TensorKind

#: the plug-ins, by the family name the tasks give (``Task.family``)
KINDS: dict[str, ModelKind] = {
    k.name: k
    for k in (
        TensorKind(),
        QuestionAnsweringKind(),
        DetectionKind(),
        ImageTextKind(),
        ExportedKind(),
        CausalLMKind(),
        Seq2SeqLMKind(),
    )
}


def of(spec: ModelSpec) -> ModelKind:
    """The kind that serves ``spec``: its task's family."""
    return KINDS[task_of(spec).family]


def with_defaults(spec: ModelSpec, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """A request's ``params`` for ``method`` over the model's models.toml ``defaults`` of that
    method: what the request asks, every route and job alike."""
    return {**spec.defaults.get(method, {}), **params}


def check_defaults(spec: ModelSpec, settings: Settings) -> None:
    """Start-up check of models.toml ``defaults``: each method serves the model and its params
    validate; a ValueError naming the model and the method otherwise (the server does not
    start, a repository load fails)."""
    for method, params in spec.defaults.items():
        try:
            of(spec).check(spec, method, dict(params), settings)
        except ServiceError as exc:
            raise ValueError(
                f"model {spec.id!r}: defaults.{method} cannot run: {exc.detail}"
            ) from None


def run(lm: LoadedModel, work: Work) -> Reply:
    """Work on its loaded model (in the worker), by the run its type registered: importing
    the kinds registers theirs (attributions, predictions, generation), and unpickling a
    capability's work imports its own."""
    return run_work(lm, work)


__all__ = ["KINDS", "ModelKind", "check_defaults", "of", "run", "with_defaults"]
