"""The one registry of model tasks: each task is one record, chosen once from the spec, and what
it declares is what its models were served with before the registry (the kind-name compares it
replaced)."""

from __future__ import annotations

import dataclasses

import pytest

import model_registry
from model_registry import RegistryError, tasks
from model_registry.sources import SOURCES
from model_registry.spec import ExportedStep
from model_registry.task_loaders import finish_tensor, read_tensor
from model_registry.tasks import (
    ATTACKS,
    ATTRIBUTIONS,
    CONTEXT_ATTRIBUTIONS,
    COUNTERFACTUALS,
    INFLUENCE,
    TCAV,
)

EVERY = [*tasks.TASKS.values(), tasks.EXPORTED_ATTRIBUTION]
BUILTIN = {s.id: s for s in model_registry.builtin_specs()}

_TENSOR = {ATTRIBUTIONS, ATTACKS, COUNTERFACTUALS, TCAV, INFLUENCE}
_LM = ({ATTRIBUTIONS, CONTEXT_ATTRIBUTIONS}, True, False, False)
#: task -> (operations, streams, takes jobs, predicts)
DECLARED = {
    "tensor": (_TENSOR, False, True, True),
    # token ids are neither attacked nor moved (the routes refused them by their tokenizer)
    "text_classification": (_TENSOR - {ATTACKS, COUNTERFACTUALS}, False, True, True),
    "token_classification": (_TENSOR - {ATTACKS, COUNTERFACTUALS}, False, True, True),
    "image_classification": (_TENSOR, False, True, True),
    # CONTRACT 9.4: the tasks beside classifiers
    "multi_label_classification": (_TENSOR, False, True, True),
    "regression": (_TENSOR, False, True, True),
    "semantic_segmentation": ({ATTRIBUTIONS}, False, True, True),
    "question_answering": ({ATTRIBUTIONS}, False, True, True),
    "object_detection": ({ATTRIBUTIONS}, False, True, True),
    "image_text_similarity": ({ATTRIBUTIONS}, False, True, True),
    "causal_lm": _LM,
    "seq2seq_lm": _LM,
    "exported_attribution": ({ATTRIBUTIONS}, False, True, False),
}


def test_every_task_is_declared_here_and_served_by_a_source() -> None:
    assert {t.name for t in EVERY} == set(DECLARED)
    assert set(tasks.TASKS) == {name for s in SOURCES.values() for name in s.tasks}
    # chosen by its source, never by models.toml's kind
    assert tasks.EXPORTED_ATTRIBUTION.name not in tasks.TASKS


@pytest.mark.parametrize("task", EVERY, ids=lambda t: t.name)
def test_each_task_declares_what_it_supports(task: tasks.Task) -> None:
    operations, streams, jobs, predicts = DECLARED[task.name]
    assert task.operations == operations
    assert (task.streams, task.jobs, task.predicts) == (streams, jobs, predicts)
    assert [task.supports(op) for op in tasks.OPERATIONS] == [
        op in operations for op in tasks.OPERATIONS
    ]
    with pytest.raises(ValueError, match="expected one of"):
        task.supports("tcav-jobs")  # a route's name, not an operation's


def test_a_task_names_only_known_operations() -> None:
    with pytest.raises(ValueError, match=r"unknown operations \['tcavs'\]"):
        tasks.Task("x", "tensor", read_tensor, finish_tensor, frozenset({"tcavs"}))


def test_the_task_is_chosen_once_from_the_spec() -> None:
    assert tasks.task_of(BUILTIN["tabular-mlp"]) is tasks.TASKS["tensor"]
    assert tasks.task_of(BUILTIN["tiny-lm"]) is tasks.TASKS["causal_lm"]
    exported = dataclasses.replace(BUILTIN["tabular-mlp"], exported=ExportedStep("saliency"))
    # models.toml's kind (and ModelInfo's) stays "tensor"; the source chose the task
    assert exported.task == "tensor" and tasks.task_of(exported) is tasks.EXPORTED_ATTRIBUTION
    with pytest.raises(RegistryError, match="expected one of") as info:
        tasks.task_of(dataclasses.replace(BUILTIN["tabular-mlp"], task="ranking"))
    assert info.value.field == "kind"


def test_the_exported_task_is_read_and_loaded_by_its_source() -> None:
    with pytest.raises(TypeError, match="by its source alone"):
        tasks.EXPORTED_ATTRIBUTION.read(None, None)  # type: ignore[arg-type]
