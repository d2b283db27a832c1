"""A job's chunks as stored, and joined: each finished chunk's arrays and metadata (one
``.npz`` of arrays with a JSON ``meta``), several chunks merged into one before they are
written, and the chunks read back joined for the job's result; and how each kind of work's
result is answered (``ANSWERS``: as its capability's route answers, registered there)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.core.work import Reply, Work, stack_examples, worst
from service.jobs.store import JobRow


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """Chunks along dim 0 (token scores padded with zeros to the longest chunk's length)."""
    return stack_examples(parts)


def chunk_arrays(reply: Reply, job: Work) -> dict[str, np.ndarray]:
    out = {f"attributions_{i}": a for i, a in enumerate(reply.attributions)}
    if reply.outputs is not None:
        out["outputs"] = reply.outputs
    if reply.delta is not None:
        out["convergence_delta"] = reply.delta
    if reply.predictions is not None:
        out["predictions"] = reply.predictions
    meta = {
        "as_tuple": reply.as_tuple,
        "layers": reply.layers,
        "target": reply.target,
        "tokens": reply.tokens,
        "params": reply.params,
        "compute_ms": reply.compute_ms,
        "study": reply.study,
        "fidelity": reply.fidelity,
        **job.job_meta(reply),
    }
    out["meta"] = np.array(json.dumps(meta, default=_jsonable))
    return out


def merged(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Several chunks' arrays as one chunk's (examples concatenated, metadata joined)."""
    if len(parts) == 1:
        return parts[0]
    metas = [json.loads(str(p["meta"])) for p in parts]
    out = {k: concat([p[k] for p in parts]) for k in parts[0] if k != "meta"}
    meta = dict(metas[0])
    meta["target"] = [t for m in metas for t in (m.get("target") or [])] or None
    meta["tokens"] = [t for m in metas for t in (m.get("tokens") or [])] or None
    meta["compute_ms"] = sum(m.get("compute_ms", 0.0) for m in metas)
    meta["study"] = studies(metas)
    meta["fidelity"] = worst([m.get("fidelity") for m in metas])
    out["meta"] = np.array(json.dumps(meta, default=_jsonable))
    return out


def studies(metas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The chunks' ``study``: the first's, its per-example lists joined over all chunks."""
    first = metas[0].get("study") if metas else None
    if first is None:
        return None
    joined = {k: [v for m in metas for v in m["study"][k]] for k in metas[0].get("per_example", [])}
    return {**first, **joined}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


@dataclass(frozen=True)
class Finished:
    """A finished job as its answer is built from it: the chunks' replies joined into one
    (``reply``; empty for an answer that reads no chunks) and the first chunk's ``meta``."""

    row: JobRow
    model: tuple[str, str]  # id, version
    reply: Reply
    meta: dict[str, Any]
    timing_ms: dict[str, float]


@dataclass(frozen=True)
class Answer:
    """How a kind of work's job result is answered; ``chunks``: from its chunks (False: the
    result is what the job built, e.g. an influence index)."""

    build: Callable[[Finished], dict[str, Any]]
    chunks: bool = True


#: job results by the job's work label (``Work.name``: an attribution's is its method, which
#: no entry names: attributions answer as the attributions route)
ANSWERS: dict[str, Answer] = {}


def answers(
    *labels: str, chunks: bool = True
) -> Callable[[Callable[[Finished], dict[str, Any]]], Callable[[Finished], dict[str, Any]]]:
    """Register the answer of the jobs whose work has one of ``labels``."""

    def register(fn: Callable[[Finished], dict[str, Any]]) -> Callable[[Finished], dict[str, Any]]:
        for label in labels:
            ANSWERS[label] = Answer(fn, chunks)
        return fn

    return register
