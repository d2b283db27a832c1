"""Dynamic batching: which jobs may share one engine call, and merging/splitting them.

Only engine calls that are separable per example are merged: inputs are concatenated, targets
become one entry per example, and baselines/params must be identical (so they broadcast).
Seeded stochastic requests are never merged: their numbers would depend on their companions.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import orjson

from methods.params import MethodParams
from methods.registry import MethodSpec
from service.core.work import PREDICT, Job, Reply
from service.wire.targets import per_example


def _digest(value: Any) -> Any:
    """A hashable fingerprint of params/baselines; None when a tensor is per example."""
    if isinstance(value, np.ndarray):
        h = hashlib.blake2b(value.tobytes(), digest_size=12).hexdigest()
        return ("array", str(value.dtype), value.shape, h)
    if isinstance(value, (list, tuple)):
        return tuple(_digest(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _digest(v)) for k, v in value.items()))
    return value


def _broadcasts(value: Any, shared: bool) -> bool:
    """Whether a tensor argument is the same for every example (so merged calls share it)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 or value.shape[0] == 1 or shared
    if isinstance(value, (list, tuple)):
        return all(_broadcasts(v, shared) for v in value)
    if isinstance(value, dict):
        return all(_broadcasts(v, shared) for v in value.values())
    return True


def _has_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, (list, tuple)) and any(_has_array(v) for v in value)


def _target_form(job: Job) -> Any:
    t = job.target
    if t is None:
        return None
    if t["kind"] in ("index", "per_example"):
        return "class" if t["kind"] == "per_example" or len(t["index"]) == 1 else len(t["index"])
    if t["kind"] == "per_example_tuple":
        return len(t["rows"][0])
    return t["kind"]


def predict_key(job: Job) -> tuple[Any, ...] | None:
    """Predictions merge whenever their tensors stack (texts: each tokenized on its own)."""
    if job.texts:
        return None
    return (job.model_id, PREDICT, tuple((a.dtype.str, a.shape[1:]) for a in job.arrays))


def merge_key(job: Job, ms: MethodSpec, p: MethodParams) -> tuple[Any, ...] | None:
    """Jobs with equal keys give the same numbers merged as one by one; None: never merge."""
    if job.texts or job.verify or not ms.merges(p):  # verify: figures of the job's own rows
        return None
    if (ms.stochastic or job.noise_tunnel is not None) and job.seed is not None:
        return None
    # params only broadcast: a per-example tensor (e.g. a feature mask per row) never merges
    if not _broadcasts(job.params, False):
        return None
    if not _broadcasts(job.baselines, ms.merge == "shared_baselines"):
        return None
    params = orjson.dumps(
        {k: v for k, v in job.params.items() if not _has_array(v)},
        option=orjson.OPT_SORT_KEYS,
    )
    return (
        job.model_id,
        job.method,
        params,
        _digest(job.params),
        _digest(job.baselines),
        _target_form(job),
        tuple((a.dtype.str, a.shape[1:]) for a in job.arrays),
        job.internal_batch_size,
        job.perturbations_per_eval,
        _digest(job.noise_tunnel),
        job.return_delta,
        job.attributed_layer,
        job.post_abs,
    )


def merge(jobs: list[Job]) -> Job:
    """One job computing every job's examples (same key assumed)."""
    first = jobs[0]
    n = sum(j.n for j in jobs)
    arrays = tuple(
        np.concatenate([j.arrays[i] for j in jobs], axis=0) for i in range(len(first.arrays))
    )
    target = first.target
    if target is not None and target["kind"] != "predicted":
        parts = [per_example(j.target, j.n) for j in jobs]
        rows = [r for p in parts if p is not None for r in p["rows"]]
        target = {"kind": parts[0]["kind"] if parts[0] else "per_example", "rows": rows}
    return Job(
        id=first.id,
        model_id=first.model_id,
        method=first.method,
        arrays=arrays,
        texts=(),
        target=target,
        baselines=first.baselines,
        params=first.params,
        internal_batch_size=first.internal_batch_size,
        perturbations_per_eval=first.perturbations_per_eval,
        noise_tunnel=first.noise_tunnel,
        seed=None,
        return_delta=first.return_delta,
        deadline=max(j.deadline for j in jobs),
        n=n,
        cost=sum(j.cost for j in jobs),
        attributed_layer=first.attributed_layer,
        post_abs=first.post_abs,
        key=first.key,
        request_id=",".join(j.request_id for j in jobs),
        max_tokens=first.max_tokens,
        predictions=any(j.predictions for j in jobs),
    )


def _cut(arr: np.ndarray | None, total: int, start: int, n: int) -> np.ndarray | None:
    if arr is None:
        return None
    if arr.ndim == 0 or arr.shape[0] % total:
        return arr
    k = arr.shape[0] // total  # rows per example (e.g. one delta per sample)
    return arr[start * k : (start + n) * k]


def split(reply: Reply, jobs: list[Job]) -> list[Reply]:
    """The merged reply cut back into one reply per job, in order."""
    total = sum(j.n for j in jobs)
    out: list[Reply] = []
    start = 0
    for j in jobs:
        out.append(
            Reply(
                job_id=j.id,
                attributions=[_cut(a, total, start, j.n) for a in reply.attributions],  # type: ignore[misc]
                as_tuple=reply.as_tuple,
                delta=_cut(reply.delta, total, start, j.n),
                outputs=_cut(reply.outputs, total, start, j.n),
                target=None if reply.target is None else reply.target[start : start + j.n],
                params=reply.params,
                predictions=_cut(reply.predictions, total, start, j.n),
                compute_ms=reply.compute_ms,
                merged=len(jobs),
            )
        )
        start += j.n
    return out
