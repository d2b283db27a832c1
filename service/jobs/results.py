"""A job's chunks as stored, and joined: each finished chunk's arrays and metadata (one
``.npz`` of arrays with a JSON ``meta``), several chunks merged into one before they are
written, and the chunks read back joined into one reply, which the job's capability answers
as its route does (``Capability.result``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from service.core.work import Reply, Work, stack_examples, worst


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
    """The chunks' ``study``: the first's, its per-example lists joined over all chunks
    (``per_example`` names them; a dotted name, a list inside a member:
    ``"proponents.indices"``)."""
    first = metas[0].get("study") if metas else None
    if first is None:
        return None
    out = json.loads(json.dumps(first))  # a copy, nested members too
    for name in metas[0].get("per_example", []):
        *path, last = name.split(".")
        parts = []
        for m in metas:
            at = m["study"]
            for key in path:
                at = at[key]
            parts.append(at[last])
        into = out
        for key in path:
            into = into[key]
        into[last] = [v for part in parts for v in part]
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def joined_reply(chunks: list[dict[str, np.ndarray]], metas: list[dict[str, Any]]) -> Reply:
    """The chunks read back (``chunk_arrays``' form, in example order) as one reply."""
    first = metas[0] if metas else {}
    n_attr = sum(1 for k in chunks[0] if k.startswith("attributions_")) if chunks else 0

    def joined(key: str) -> np.ndarray | None:
        return concat([c[key] for c in chunks]) if chunks and key in chunks[0] else None

    return Reply(
        job_id=0,
        attributions=[concat([c[f"attributions_{i}"] for c in chunks]) for i in range(n_attr)],
        as_tuple=bool(first.get("as_tuple")),
        layers=first.get("layers"),
        delta=joined("convergence_delta"),
        outputs=joined("outputs"),
        target=[t for m in metas for t in (m.get("target") or [])] or None,
        tokens=[t for m in metas for t in (m.get("tokens") or [])] or None,
        params=first.get("params", {}),
        predictions=joined("predictions"),
        study=studies(metas),
        fidelity=worst([m.get("fidelity") for m in metas]),
        compute_ms=sum(m.get("compute_ms", 0.0) for m in metas),
    )
