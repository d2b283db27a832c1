"""Dynamic batching in the worker: jobs with equal keys (``service.kinds.merging``) merged into
one engine call, and its reply split back into one per job."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np

from service.core.work import Attribution, Reply, Work, own_fidelity
from service.wire import targets

W = TypeVar("W", bound=Work)


def merge(jobs: list[W]) -> W:
    """One piece of work computing every one's examples (same key assumed: the same type,
    model, params and baselines; ``service.kinds.merging``)."""
    first = jobs[0]
    extra: dict[str, Any] = {}
    attributions = [j for j in jobs if isinstance(j, Attribution)]
    if attributions:
        extra = {
            "target": targets.concat([(j.target, j.n) for j in attributions]),
            "seed": None,
            "predictions": any(j.predictions for j in attributions),
        }
    return dataclasses.replace(
        first,
        arrays=tuple(
            np.concatenate([j.arrays[i] for j in jobs], axis=0) for i in range(len(first.arrays))
        ),
        texts=tuple(t for j in jobs for t in j.texts),  # texts merge where they batch unchanged
        deadline=max(j.deadline for j in jobs),
        n=sum(j.n for j in jobs),
        cost=sum(j.cost for j in jobs),
        request_id=",".join(j.request_id for j in jobs),
        **extra,
    )


def _cut(arr: np.ndarray | None, total: int, start: int, n: int) -> np.ndarray | None:
    if arr is None:
        return None
    if arr.ndim == 0 or arr.shape[0] % total:
        return arr
    k = arr.shape[0] // total  # rows per example (e.g. one delta per sample)
    return arr[start * k : (start + n) * k]


def split(reply: Reply, jobs: list[W]) -> list[Reply]:
    """The merged reply cut back into one reply per job, in order."""
    total = sum(j.n for j in jobs)
    out: list[Reply] = []
    start = 0
    width = None if reply.tokens is None else max((len(t) for t in reply.tokens), default=0)
    for j in jobs:
        tokens = None if reply.tokens is None else reply.tokens[start : start + j.n]
        out.append(
            Reply(
                job_id=j.id,
                attributions=[
                    _own_width(_cut(a, total, start, j.n), tokens, width)  # type: ignore[misc]
                    for a in reply.attributions
                ],
                tokens=tokens,
                as_tuple=reply.as_tuple,
                layers=reply.layers,
                delta=_cut(reply.delta, total, start, j.n),
                outputs=_cut(reply.outputs, total, start, j.n),
                target=None if reply.target is None else reply.target[start : start + j.n],
                params=reply.params,
                predictions=_own_width(_cut(reply.predictions, total, start, j.n), tokens, width),
                compute_ms=reply.compute_ms,
                merged=len(jobs),
                fidelity=own_fidelity(reply.fidelity, start, j.n),
            )
        )
        start += j.n
    return out


def _own_width(
    a: np.ndarray | None, tokens: list[list[str]] | None, width: int | None
) -> np.ndarray | None:
    """Per-token values of merged texts (dim 1 as wide as the merged batch's longest text)
    cut to the job's own longest text: the width they have computed alone."""
    if a is None or tokens is None or a.ndim < 2 or a.shape[1] != width:
        return a
    return a[:, : max((len(t) for t in tokens), default=0)]
