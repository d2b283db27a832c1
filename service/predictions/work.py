"""Predict, and explain where it matters: one forward over every example, each prediction
tested against the request's JMESPath condition (``explain_if``), and the attribution run on
the examples it chose only, all in one visit to the worker."""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import jmespath
import numpy as np
import torch
from jmespath.exceptions import JMESPathError

from model_registry.spec import LoadedModel, ModelSpec
from model_registry.tasks import task_of
from service.core.errors import InvalidRequest
from service.core.work import Attribution, Reply, runs
from service.kinds import tensor, tensors
from service.wire import targets

#: where a condition's error is told
LOC = ("body", "explain_if")


@functools.lru_cache(maxsize=256)
def compiled(expression: str) -> Any:
    """``expression`` parsed (a 422 naming ``explain_if`` where it is not JMESPath)."""
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        raise InvalidRequest(f"explain_if is not a JMESPath expression: {exc}", loc=LOC) from None


def truthy(value: Any) -> bool:
    """JMESPath's truth: false, null, and an empty string, list or object are false."""
    return not (value is None or value is False or value in ("", [], {}))


def predictions(spec: ModelSpec, out: np.ndarray) -> list[dict[str, Any]]:
    """Each example's prediction: its label, class and probability (a softmax over the
    classes; a multi-label model's: the class's own sigmoid), and its whole output. A
    regression has no class: only its output."""
    task = task_of(spec)
    rows = out.reshape(out.shape[0], -1).astype(np.float64)
    if task.targets == "none" or (rows.shape[1] == 1 and not spec.output.labels):
        return [{"label": None, "class": None, "probability": None,
                 "output": _plain(row)} for row in out]  # fmt: skip
    classes = rows.argmax(axis=1)
    if task.independent:
        probs = 1.0 / (1.0 + np.exp(-rows))
    else:
        shifted = np.exp(rows - rows.max(axis=1, keepdims=True))
        probs = shifted / shifted.sum(axis=1, keepdims=True)
    labels = spec.output.labels
    return [
        {
            "label": labels[c] if c < len(labels) else str(c),
            "class": int(c),
            "probability": float(probs[i, c]),
            "output": _plain(out[i]),
        }
        for i, c in enumerate(classes)
    ]


def _plain(row: np.ndarray) -> Any:
    value = np.asarray(row).tolist()
    return value[0] if isinstance(value, list) and len(value) == 1 else value


@dataclass(kw_only=True)
class PredictExplain(Attribution):
    """Predictions for every example; the attribution where ``explain_if`` holds."""

    label: ClassVar[str] = "predictions"
    #: a job would cut the examples the condition sees: whole, as one call
    divisible: ClassVar[bool] = False

    explain_if: str | None = None


@runs(PredictExplain)
def predict_explain(lm: LoadedModel, work: PredictExplain) -> Reply:
    """One forward; the condition on each prediction; the method on the chosen examples."""
    t0 = time.perf_counter()
    xs, tokens = tensors.inputs(lm, work)
    out = tensors.numpy(tensors.forward(lm, xs))
    made = predictions(lm.spec, out)
    chosen: list[int] = []
    if work.explain_if is not None:
        expression = compiled(work.explain_if)
        try:
            chosen = [i for i, p in enumerate(made) if truthy(expression.search(p))]
        except JMESPathError as exc:  # a function given arguments of the wrong type
            raise InvalidRequest(f"explain_if cannot be evaluated: {exc}", loc=LOC) from None
    reply = Reply(work_id=work.id, predictions=out, tokens=tokens)
    if chosen:  # the attribution's own work, of the chosen examples
        fields = {f.name: getattr(work, f.name) for f in dataclasses.fields(Attribution) if f.init}
        if targets.predicted(work.target):  # the forward above predicted them: no second one
            fields["target"] = targets.of_predictions(torch.from_numpy(out))
        sub = Attribution(**fields).take(np.asarray(chosen))
        explained = tensor.attribute(lm, sub)
        reply = explained  # the attributions of the chosen examples, in their order
        reply.work_id, reply.predictions, reply.tokens = work.id, out, tokens
    reply.study = {"predictions": made, "chosen": chosen}
    reply.compute_ms = (time.perf_counter() - t0) * 1e3
    return reply
