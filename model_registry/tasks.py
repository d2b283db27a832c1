"""What a model does, one record per task: the one registry of model tasks.

A model's task is what models.toml's ``kind`` (and ``ModelInfo.kind`` on the wire) names:
``"tensor"``, a Hugging Face classifier's task, the tasks teams serve beside classifiers
(``"multi_label_classification"``, ``"regression"``, ``"semantic_segmentation"``,
``"question_answering"``, ``"object_detection"``, ``"image_text_similarity"``),
``"causal_lm"``, ``"seq2seq_lm"``; and one
task its source chooses: an ``attribution-export:`` file computing one attribution. Each
``Task`` declares how its models.toml table is read and its built model finished
(``task_loaders``), which service plug-in family serves it (``service.kinds``, keyed by
``Task.family``) and what it supports: the operations, as the HTTP routes name them, and what
they need to know of it (it streams answers, takes jobs, gives predictions). Operations ask
the task (``task_of(spec).supports("tcav")``, ``.streams``); nothing compares task names.

Adding a task is one record in ``_TASKS`` (and, for a new family, one plug-in module in
``service.kinds``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

import torch

from model_registry.errors import RegistryError
from model_registry.spec import LoadedModel, ModelSpec
from model_registry.table import Table
from model_registry.task_loaders import (
    Built,
    finish_detection,
    finish_language_model,
    finish_tensor,
    read_causal_lm,
    read_detection,
    read_image_text,
    read_multi_label,
    read_question_answering,
    read_regression,
    read_segmentation,
    read_seq2seq_lm,
    read_tensor,
)

#: the operations a task may support, as the routes ``POST /v1/models/{id}/{operation}`` name
#: them
ATTRIBUTIONS = "attributions"
CONTEXT_ATTRIBUTIONS = "context-attributions"
ATTACKS = "attacks"
COUNTERFACTUALS = "counterfactuals"
TCAV = "tcav"
INFLUENCE = "influence"
OPERATIONS = (ATTRIBUTIONS, CONTEXT_ATTRIBUTIONS, ATTACKS, COUNTERFACTUALS, TCAV, INFLUENCE)


@dataclass(frozen=True)
class Task:
    """A model task: how its models are read and finished, who serves them, and what for."""

    #: models.toml's ``kind`` and ``ModelSpec.task`` (and ``ModelInfo.kind``)
    name: str
    #: the service plug-in that serves it (a key of ``service.kinds.KINDS``): "tensor",
    #: "exported", "causal_lm", "seq2seq_lm"
    family: str
    #: the spec of a models.toml table of the task; ``base``: the source's spec (a built-in's,
    #: a Hugging Face classifier's), filling what the table does not give
    read: Callable[[Table, ModelSpec | None], ModelSpec]
    #: the built model on its device in its dtype, frozen and checked
    finish: Callable[[ModelSpec, Built, torch.device], LoadedModel]
    #: the operations it supports (``OPERATIONS``); a route may still refuse a model for what
    #: its spec says (integer inputs cannot be attacked)
    operations: frozenset[str]
    #: whether attributions may be answered as an event stream (Accept: text/event-stream),
    #: row by row as the answer is generated
    streams: bool = False
    #: whether attribution jobs take it (its work cut into chunks of examples)
    jobs: bool = True
    #: whether it gives predictions (``:predict``, OIP infer, and what needs its forward)
    predicts: bool = True
    #: what a request's ``target`` names (``service.wire.targets``): "classes" (a class or
    #: label, an index, per example), "none" (one value per example: a regression), "region"
    #: (a class over a region of a segmentation output), "answer" ("start", "end" or "span"
    #: of an extracted answer), "box" (a box and label among a detector's detections)
    targets: str = "classes"
    #: each label is its own yes or no (multi-label): probabilities are per-label sigmoids and
    #: the predicted labels those over 0.5
    independent: bool = False
    #: whether a ``python:`` factory may build it (False: its source alone knows its inputs)
    from_code: bool = True

    def __post_init__(self) -> None:
        unknown = sorted(self.operations - set(OPERATIONS))
        if unknown:
            raise ValueError(f"task {self.name!r}: unknown operations {unknown}")

    def supports(self, operation: str) -> bool:
        """Whether the task's models serve ``operation`` (a name of ``OPERATIONS``)."""
        if operation not in OPERATIONS:
            raise ValueError(f"expected one of {list(OPERATIONS)}, got {operation!r}")
        return operation in self.operations


def _by_its_source(*_: Any) -> NoReturn:
    raise TypeError("an attribution-export file is read and loaded by its source alone")


#: what a tensor model serves; a classifier of token ids is neither attacked nor moved
_TENSOR = frozenset({ATTRIBUTIONS, ATTACKS, COUNTERFACTUALS, TCAV, INFLUENCE})
_TOKEN_IDS = _TENSOR - {ATTACKS, COUNTERFACTUALS}
#: a map or a box per example (segmentation, detection): no class to attack, move or test
_ATTRIBUTIONS_ONLY = frozenset({ATTRIBUTIONS})
#: what a generative language model serves: the prompt's (or the context's) part in an answer
_GENERATIVE = frozenset({ATTRIBUTIONS, CONTEXT_ATTRIBUTIONS})


def _tensor(
    name: str,
    operations: frozenset[str] = _TENSOR,
    read: Callable[[Table, ModelSpec | None], ModelSpec] = read_tensor,
    **traits: Any,
) -> Task:
    """A task of tensor models: tensors (or texts through a tokenizer) in, one tensor out."""
    return Task(name, traits.pop("family", "tensor"), read, finish_tensor, operations, **traits)


def _generative(name: str, read: Callable[[Table, ModelSpec | None], ModelSpec]) -> Task:
    """A task of generative language models (its own family): one prompt a request, its
    answer attributed as it is generated."""
    return Task(
        name, name, read, finish_language_model, _GENERATIVE, streams=True, jobs=False,
        predicts=False,
    )  # fmt: skip


_TASKS = (
    _tensor("tensor"),  # every method
    # the Hugging Face classifiers (CONTRACT 7.5): tensor models of token ids or pixel_values
    _tensor("text_classification", _TOKEN_IDS),
    _tensor("token_classification", _TOKEN_IDS),
    _tensor("image_classification"),
    # the tasks teams serve beside classifiers (CONTRACT 9.4)
    _tensor("multi_label_classification", read=read_multi_label, independent=True),
    _tensor("regression", read=read_regression, targets="none"),
    _tensor("semantic_segmentation", _ATTRIBUTIONS_ONLY, read_segmentation, targets="region"),
    _tensor(
        "question_answering",
        _TOKEN_IDS - {TCAV, INFLUENCE},
        read_question_answering,
        targets="answer",
        family="question_answering",
        from_code=False,
    ),
    # an image and a text, their similarity attributed to both (model_registry.hf_clip)
    Task(
        "image_text_similarity",
        "image_text",
        read_image_text,
        finish_tensor,
        _ATTRIBUTIONS_ONLY,
        targets="none",
        from_code=False,
    ),
    # detections scored per wanted box and label (model_registry.detection)
    Task(
        "object_detection",
        "object_detection",
        read_detection,
        finish_detection,
        _ATTRIBUTIONS_ONLY,
        targets="box",
    ),
    # the prompt's part in an answer
    _generative("causal_lm", read_causal_lm),
    # an encoder-decoder (translation, summaries): the source's part in an answer
    _generative("seq2seq_lm", read_seq2seq_lm),
)

#: every task models.toml's ``kind`` names, by that name
TASKS: Mapping[str, Task] = MappingProxyType({t.name: t for t in _TASKS})

#: the tasks of a model that takes tensors as declared in models.toml (any source of tensor
#: models serves these: a file, a remote predictor); the first is the default
DECLARED_TENSOR_TASKS = (
    "tensor", "multi_label_classification", "regression", "semantic_segmentation",
    "object_detection",
)  # fmt: skip

#: a file computing one attribution of a tensor model (``attribution-export:``): chosen by its
#: source (the spec's ``exported`` step), not by models.toml's ``kind``, which stays "tensor"
EXPORTED_ATTRIBUTION = Task(
    "exported_attribution",
    "exported",
    _by_its_source,
    _by_its_source,
    frozenset({ATTRIBUTIONS}),
    predicts=False,
)


def task_of(spec: ModelSpec) -> Task:
    """The task of ``spec`` (a RegistryError where a spec made in code names none)."""
    if spec.exported is not None:
        return EXPORTED_ATTRIBUTION
    task = TASKS.get(spec.task)
    if task is None:
        raise RegistryError(
            f"expected one of {list(TASKS)}, got {spec.task!r}", model=spec.id, field="kind"
        )
    return task
