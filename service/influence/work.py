"""Training-data influence in the worker (CONTRACT 7.4): a chunk of the training set made into
its part of the influence index, and test examples queried against the whole index.

The index is built by the job runner in chunks of training examples (``InfluenceIndexPart``
jobs): each chunk's reply carries the index's per-example tensors as arrays (named in
``Reply.study``) and, after them, the tensors the whole index shares (checkpoint fingerprints,
projection matrices: the same in every chunk). A query (``InfluenceQuery``) loads the finished
index file once per worker and answers with the top k proponents (and opponents) per example.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import torch

from methods.data_influence import InfluenceIndex, build_index, query
from methods.data_influence.index import PER_EXAMPLE
from methods.errors import AttributionError
from model_registry.spec import LoadedModel
from service.core.work import Reply, Work, runs
from service.kinds import tensors
from service.wire.engine_errors import from_engine

WHERE: dict[str, tuple[str | int, ...]] = {
    "inputs": ("body", "inputs"),
    "labels": ("body", "labels"),
    "k": ("body", "k"),
}
CLASS_LOSSES = ("cross_entropy", "nll")


def _checkpoints(lm: LoadedModel, s: dict[str, Any]) -> list[dict[str, Any]]:
    """The checkpoints' state dicts (read once per worker) with their learning rates."""
    cache: dict[str, Any] = lm.extra.setdefault("influence_checkpoints", {})
    out = []
    for path, lr in s["checkpoints"]:
        if path not in cache:
            cache[path] = torch.load(path, map_location=lm.device, weights_only=True)
        out.append({"weights": cache[path], "lr": lr})
    return out


def _data(
    lm: LoadedModel, work: InfluenceQuery | InfluenceIndexPart
) -> tuple[Any, torch.Tensor | None]:
    """The job's inputs as the model takes them, and its labels (the last array) in the dtype
    the loss takes; None without labels."""
    s = work.study or {}
    has_labels = bool(s.get("labels"))
    arrays = work.arrays[:-1] if has_labels else work.arrays
    xs, _ = tensors.inputs(lm, replace(work, arrays=arrays))
    labels = None
    if has_labels:
        y = tensors.tensor(work.arrays[-1], lm.device)
        if s["loss"] in CLASS_LOSSES:
            labels = y.long()
        else:
            labels = y.to(xs[0].dtype if xs[0].is_floating_point() else torch.float32)
    return (xs if len(xs) > 1 else xs[0]), labels


@dataclass(kw_only=True)
class InfluenceQuery(Work):
    """Test examples (and their labels, the last array when given) against a built index."""

    label: ClassVar[str] = "influence"

    #: the index's file, k, opponents, the loss and its labels, checkpoints
    study: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class InfluenceIndexPart(Work):
    """A chunk of the training set made into its part of an influence index."""

    label: ClassVar[str] = "influence_index"

    #: the index's method, loss, labels, checkpoints and projection settings
    study: dict[str, Any] = field(default_factory=dict)


@runs(InfluenceIndexPart)
def run_part(lm: LoadedModel, work: InfluenceIndexPart) -> Reply:
    try:
        return _part(lm, work)
    except AttributionError as exc:
        raise from_engine(exc, work.request_id, WHERE) from None


@runs(InfluenceQuery)
def run_query(lm: LoadedModel, work: InfluenceQuery) -> Reply:
    try:
        return _query(lm, work)
    except AttributionError as exc:
        raise from_engine(exc, work.request_id, WHERE) from None


def _part(lm: LoadedModel, work: InfluenceIndexPart) -> Reply:
    t0 = time.perf_counter()
    s = work.study or {}
    xs, labels = _data(lm, work)
    index = build_index(
        lm.model,
        xs,
        labels,
        method=s["method"],
        checkpoints=_checkpoints(lm, s) if s["method"] != "similarity" else None,
        loss=s["loss"],
        layers=s["layers"],
        batch_size=s["batch_size"],
        projection_dim=s["projection_dim"],
        seed=s["seed"],
        similarity=s["similarity"],
    )
    d = index.to_dict()
    per = [k for k in d["tensors"] if k.split(".")[0] in PER_EXAMPLE]
    shared = [k for k in d["tensors"] if k not in per]
    return Reply(
        work_id=work.id,
        attributions=[tensors.numpy(d["tensors"][k]) for k in (*per, *shared)],
        study={
            "per_example": per,
            "shared": shared,
            "shared_rows": {k: int(d["tensors"][k].shape[0]) for k in shared},
            "metadata": d["metadata"],
        },
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


def load_index(path: str, device: torch.device) -> InfluenceIndex:
    saved = torch.load(path, map_location=device, weights_only=True)
    return InfluenceIndex.from_dict(saved)


def _index(lm: LoadedModel, path: str) -> InfluenceIndex:
    held = lm.extra.get("influence_index")
    if held is None or held[0] != path:
        held = lm.extra["influence_index"] = (path, load_index(path, lm.device))
    found: InfluenceIndex = held[1]
    return found


def _query(lm: LoadedModel, work: InfluenceQuery) -> Reply:
    t0 = time.perf_counter()
    s = work.study or {}
    index = _index(lm, s["index"])
    xs, labels = _data(lm, work)
    if labels is None and index.method != "similarity":  # the model's own predictions
        out = tensors.forward(lm, tuple(xs) if isinstance(xs, tuple) else (xs,))
        labels = out.argmax(dim=-1)
    checkpoints = _checkpoints(lm, s) if index.method != "similarity" else None
    found: dict[str, Any] = {}
    for side in ("proponents", "opponents") if s["opponents"] else ("proponents",):
        res = query(
            index,
            lm.model,
            xs,
            labels,
            checkpoints=checkpoints,
            k=s["k"],
            proponents=side == "proponents",
        )
        if res.indices is None:
            raise AttributionError("the query returned no indices", argument="k")
        found[side] = {
            "indices": res.indices.cpu().numpy().astype(np.int64).tolist(),
            "scores": res.scores.detach().cpu().double().numpy().tolist(),
        }
    rows = [f"{side}.{k}" for side in found for k in ("indices", "scores")]  # per example
    return Reply(
        work_id=work.id,
        study=found,
        study_rows=rows,
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )
