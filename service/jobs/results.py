"""A job's chunks as stored, and joined: each finished chunk's arrays and metadata (one
``.npz`` of arrays with a JSON ``meta``), several chunks merged into one before they are
written, and the chunks read back joined for the job's result."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from service.core.work import ATTACK, COUNTERFACTUAL, Job, Reply


def concat(parts: list[np.ndarray]) -> np.ndarray:
    """Chunks along dim 0; token scores padded with zeros to the longest chunk's length."""
    if parts and parts[0].ndim >= 2:
        width = max(p.shape[-1] for p in parts)
        parts = [
            np.pad(p, [(0, 0)] * (p.ndim - 1) + [(0, width - p.shape[-1])])
            if p.shape[-1] != width
            else p
            for p in parts
        ]
    return np.concatenate(parts, axis=0) if parts else np.zeros(0)


def chunk_arrays(reply: Reply, job: Job) -> dict[str, np.ndarray]:
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
        "requested": job.requested,
        "attributed_layer": job.attributed_layer,
        "study": reply.study,
        # attacks and counterfactuals: which, and their per-example lists (flipped, min_param)
        "name": (job.study or {}).get("name"),
        "per_example": list(reply.study or {}) if job.method in (ATTACK, COUNTERFACTUAL) else [],
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
