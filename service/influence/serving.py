"""Influence queries (CONTRACT 7.4): the test examples and their labels checked and decoded,
then answered by a worker from the model's influence index."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import numpy as np

from model_registry.influence import read_train_data
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest, NotReady
from service.core.offload import offload as in_thread
from service.core.settings import Settings
from service.core.work import Work, new_id
from service.http.state import AppState
from service.influence.indexes import InfluenceIndexes
from service.influence.protocol import InfluenceRequest, InfluenceResponse, per_example
from service.influence.work import InfluenceQuery
from service.serving.capability import Capability, Done
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
        if wire is not None and wire["form"] == "predicted":
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
    method: str = "",
) -> InfluenceQuery:
    """Every check that needs no model: the query as work for the worker; ``method``: the
    index's (kept for the answer)."""
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
            "method": method,
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


class Influence(Capability[InfluenceRequest]):
    """``POST /v1/models/{model_id}/influence``: the training examples that most helped (and
    hindered) each example's loss, from the model's influence index."""

    operation = "influence"
    stem = "influence"
    request = InfluenceRequest
    response = InfluenceResponse
    job_operation_id = "submitInfluenceJob"

    async def start(self, state: AppState) -> None:
        """The models' influence indexes: read, or built by a job (``InfluenceIndexes``)."""
        state.influence = InfluenceIndexes(state.settings, state.specs, state.jobs)
        await state.influence.start()

    async def stop(self, state: AppState) -> None:
        if state.influence is not None:
            await state.influence.stop()

    async def prepare(self, state: AppState, spec: ModelSpec, req: InfluenceRequest) -> Any:
        """The model's index, ready (409 while it builds): its file and what it says."""
        if state.influence is None:
            raise NotReady("this server runs no workers; influence needs them")
        index, path = state.influence.ready(spec)
        return str(path), index.info

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: InfluenceRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        path, info = prepared
        n_train = int(info["n_train"])
        return query_job(settings, spec, req, path, n_train, deadline, str(info["method"]))

    def options(self, req: InfluenceRequest, work: Work) -> dict[str, Any]:
        method = work.study["method"] if isinstance(work, InfluenceQuery) else None
        return {"include_examples": req.include_examples, "method": method}

    def answer(self, done: Done) -> dict[str, Any]:
        found = done.reply.study or {}
        body: dict[str, Any] = {
            "model_id": done.spec.id,
            "model_version": done.spec.version,
            "method": done.options.get("method"),
            "proponents": per_example(found["proponents"]),
        }
        if "opponents" in found:
            body["opponents"] = per_example(found["opponents"])
        if done.job and done.options.get("include_examples"):
            _with_examples(done.spec, body)  # a job's result is answered in a thread
        body["timing_ms"] = done.timing_ms
        return body

    async def finish(
        self, req: InfluenceRequest, done: Done, body: dict[str, Any]
    ) -> dict[str, Any]:
        if req.include_examples:  # the training set read: off the event loop
            await in_thread(partial(_with_examples, done.spec, body))
            body["timing_ms"] = body.pop("timing_ms")  # last, as before
        return body


INFLUENCE = Influence()
