"""The service serves each model task (``model_registry.tasks``) by the plug-in of its family,
and the operations ask the task what it supports: a model of every task is refused, or not,
by each operation's check as its task declares, with the words it was refused with before."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

import model_registry
from model_registry import tasks
from model_registry.spec import ExportedStep, ModelSpec
from service import kinds
from service.attributions import streaming
from service.concepts import serving as concepts
from service.contexts import serving as contexts
from service.contexts.protocol import ContextRequest
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.wire.attributions import AttributionRequest

BUILTIN = {s.id: s for s in model_registry.builtin_specs()}


def _example(task: tasks.Task) -> ModelSpec:
    """A spec of ``task`` (a spec alone: nothing is loaded)."""
    if task is tasks.EXPORTED_ATTRIBUTION:
        step = ExportedStep("integrated_gradients", params={"n_steps": 8}, target="input")
        return dataclasses.replace(BUILTIN["tabular-mlp"], id="tab-ig", exported=step)
    if task.family == "tensor":
        base = BUILTIN["image-cnn" if task.name == "image_classification" else "tabular-mlp"]
        return dataclasses.replace(base, id=task.name, task=task.name)
    return dataclasses.replace(BUILTIN["tiny-lm"], id=task.name, task=task.name)


EXAMPLES = {t.name: _example(t) for t in (*tasks.TASKS.values(), tasks.EXPORTED_ATTRIBUTION)}


def test_every_family_has_its_plug_in_and_every_plug_in_a_task() -> None:
    families = {tasks.task_of(spec).family for spec in EXAMPLES.values()}
    assert families == set(kinds.KINDS)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_the_plug_in_gives_predictions_where_the_task_says(name: str) -> None:
    spec = EXAMPLES[name]
    task = tasks.task_of(spec)
    assert task.name == name and kinds.of(spec) is kinds.KINDS[task.family]
    assert kinds.of(spec).catalogue(spec).predicts == task.predicts


def _refused(call: Any) -> str | None:
    try:
        call()
    except (UnsupportedMethod, InvalidRequest) as exc:
        return exc.detail
    return None


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_context_attributions_only_where_the_task_supports_them(name: str) -> None:
    spec = EXAMPLES[name]
    req = ContextRequest.model_validate({"context": "Dave lives in Paris.", "query": "Where?"})
    why = _refused(lambda: contexts.build(Settings(), spec, req, time.time() + 9, "r"))
    if tasks.task_of(spec).supports("context-attributions"):
        assert why is None
    else:
        family = tasks.task_of(spec).family
        assert why == (
            f"model {spec.id!r} ({family}) does not write answers; context attributions serve "
            "generative language models (kind causal_lm)"
        )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_tcav_only_where_the_task_supports_it(name: str) -> None:
    spec = EXAMPLES[name]
    why = _refused(lambda: concepts._check_kind(spec))
    if tasks.task_of(spec).supports("tcav"):
        assert why is None
    else:
        assert why is not None and why.startswith(
            f"model {spec.id!r} ({tasks.task_of(spec).family}) has no layers to read concepts"
        )


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_streams_only_where_the_task_streams(name: str) -> None:
    spec = EXAMPLES[name]
    # a render is refused right after the task is asked: the stream never starts here
    req = AttributionRequest.model_validate(
        {"method": "saliency", "inputs": [[0.0]], "render": {"format": "png"}}
    )
    why = _refused(lambda: streaming.check(spec, req))
    if tasks.task_of(spec).streams:
        assert why == "a stream carries no pictures; leave render out"
    else:
        assert why is not None and why.startswith(
            f"model {spec.id!r} ({tasks.task_of(spec).family}) answers in one piece"
        )
