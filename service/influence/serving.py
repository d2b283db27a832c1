"""Influence queries (CONTRACT 7.4): the test examples and their labels checked and decoded,
then answered by a worker from the model's influence index."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any

import numpy as np

from model_registry.influence import read_train_data
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest
from service.core.offload import offload as in_thread
from service.core.settings import Settings
from service.core.work import new_id
from service.influence.protocol import InfluenceRequest, per_example
from service.influence.work import InfluenceQuery
from service.kinds.base import timing
from service.pool.pool import WorkerPool
from service.serving.run import budget_ms, run
from service.wire import codec, targets

CLASS_LOSSES = ("cross_entropy", "nll")


def _labels(settings: Settings, spec: ModelSpec, raw: Any, n: int, field: str) -> np.ndarray | None:
    """Class indices (for cross_entropy / nll) or a float tensor, one per example."""
    loc = ("body", field)
    if raw is None:
        return None
    if spec.influence.loss in CLASS_LOSSES:
        try:
            wire = targets.resolve(raw, spec.output, n)
        except InvalidRequest as exc:  # said of "target": said of the field given
            raise InvalidRequest(exc.detail, loc=loc) from None
        if wire is not None and wire["kind"] == "predicted":
            return None  # the worker labels each example with the model's predicted class
        rows = targets.rows(wire, n)
        if rows is None or any(not isinstance(r, int) for r in rows):
            raise InvalidRequest(
                "labels must be a class index or label name, or one per example", loc=loc
            )
        return np.asarray(rows, dtype=np.int64)
    if isinstance(raw, str):
        raise InvalidRequest(
            f"{field} {raw!r}: the model's loss is {spec.influence.loss}, which takes a "
            f"tensor of labels (one row per example), not a class",
            loc=loc,
        )
    values = codec.decode_tensor(raw, loc, settings.max_tensor_elements, "float32")
    if values.ndim == 0 or values.shape[0] != n:
        raise InvalidRequest(f"labels must have one row per example ({n})", loc=loc)
    return values


def query_job(
    settings: Settings,
    spec: ModelSpec,
    req: InfluenceRequest,
    index: str,
    n_train: int,
    deadline: float,
) -> InfluenceQuery:
    if req.labels is not None and req.target is not None:
        raise InvalidRequest("give labels or target, not both", loc=("body", "target"))
    if req.k > n_train:
        raise InvalidRequest(
            f"k is {req.k}; the training set has {n_train} examples", loc=("body", "k")
        )
    inputs = codec.decode_within(req.inputs, spec, settings)
    field = "labels" if req.labels is not None else "target"
    raw = req.labels if req.labels is not None else req.target
    labels = _labels(settings, spec, raw, inputs.n, field)
    inf = spec.influence
    return InfluenceQuery(
        id=new_id(),
        model_id=spec.id,
        n=inputs.n,
        arrays=inputs.arrays if labels is None else (*inputs.arrays, labels),
        study={
            "labels": labels is not None,
            "index": index,
            "checkpoints": [list(c) for c in inf.checkpoints],
            "loss": inf.loss,
            "k": req.k,
            "opponents": req.opponents,
        },
        texts=inputs.texts,
        deadline=deadline,
        cost=inputs.n * (2 if req.opponents else 1) * max(1, len(inf.checkpoints)),
        max_tokens=settings.max_text_tokens,
    )


#: training sets read for include_examples, by (file, size, mtime)
_TRAIN: dict[tuple[str, int, int], tuple[tuple[np.ndarray, ...], np.ndarray]] = {}


def _examples(spec: ModelSpec, indices: list[int]) -> list[dict[str, Any]]:
    """The training examples at ``indices``: each one's index, inputs and label."""
    inf = spec.influence
    if inf is None:
        return []
    path = inf.train_data
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _TRAIN:
        _TRAIN.clear()  # one training set at a time: they can be large
        _TRAIN[key] = read_train_data(spec, path)
    inputs, labels = _TRAIN[key]
    names = spec.output.labels
    shown = []
    for i in indices:
        label = labels[i].tolist()
        whole = isinstance(label, int) and not isinstance(label, bool)
        shown.append({
            "index": i,
            "inputs": inputs[0][i].tolist() if len(inputs) == 1
            else [x[i].tolist() for x in inputs],
            "label": label,
            "label_name": names[label] if names and whole and 0 <= label < len(names)
            else None,
        })  # fmt: skip
    return shown


def _with_examples(spec: ModelSpec, body: dict[str, Any]) -> None:
    """Each listed training example's inputs and label, beside its index."""
    for part in ("proponents", "opponents"):
        for top in body.get(part) or []:
            top["examples"] = _examples(spec, top["indices"])


async def examples_of(spec: ModelSpec, indices: list[int]) -> list[dict[str, Any]]:
    """``_examples`` off the event loop (it may read the training set)."""
    return await in_thread(partial(_examples, spec, indices))


async def influence(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    req: InfluenceRequest,
    index: str,
    info: dict[str, Any],
    deadline_ms: float | None,
    started: float,
) -> dict[str, Any]:
    budget = budget_ms(settings, deadline_ms, req.deadline_ms)
    deadline = time.time() + budget / 1e3
    build = partial(query_job, settings, spec, req, index, int(info["n_train"]), deadline)
    job = await in_thread(build)
    reply, queue_ms = await run(pool, job, budget, started, None)
    found = reply.study or {}
    body: dict[str, Any] = {
        "model_id": spec.id,
        "model_version": spec.version,
        "method": info["method"],
        "proponents": per_example(found["proponents"]),
    }
    if "opponents" in found:
        body["opponents"] = per_example(found["opponents"])
    if req.include_examples:
        await in_thread(partial(_with_examples, spec, body))
    body["timing_ms"] = timing(queue_ms, reply.compute_ms, started)
    return body
