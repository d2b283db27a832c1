"""Dynamic batching in the worker: jobs with equal keys (``service.kinds.merging``) merged into
one engine call, and its reply split back into one per job."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import numpy as np

from service.core.work import Attribution, Reply, Work
from service.wire import targets

W = TypeVar("W", bound=Work)


def merge(works: list[W]) -> W:
    """One piece of work computing every one's examples (same key assumed: the same type,
    model, params and baselines; ``service.kinds.merging``)."""
    first = works[0]
    extra: dict[str, Any] = {}
    attributions = [j for j in works if isinstance(j, Attribution)]
    if attributions:
        extra = {
            "target": targets.concat([(j.target, j.n) for j in attributions]),
            "seed": None,
            "predictions": any(j.predictions for j in attributions),
        }
    return dataclasses.replace(
        first,
        arrays=tuple(
            np.concatenate([j.arrays[i] for j in works], axis=0) for i in range(len(first.arrays))
        ),
        texts=tuple(t for j in works for t in j.texts),  # texts merge where they batch unchanged
        deadline=max(j.deadline for j in works),
        n=sum(j.n for j in works),
        cost=sum(j.cost for j in works),
        request_id=",".join(j.request_id for j in works),
        **extra,
    )


def split(reply: Reply, works: list[W]) -> list[Reply]:
    """The merged reply cut back into one reply per job, in order (``Reply.cut``)."""
    total = sum(j.n for j in works)
    out: list[Reply] = []
    start = 0
    for j in works:
        part = reply.cut(j.id, start, j.n, total)
        part.merged = len(works)
        out.append(part)
        start += j.n
    return out
