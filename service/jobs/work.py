"""A job as it is stored: the validated, decoded ``Job`` (arrays, texts, resolved target,
baselines, params) in one ``.npz`` file, read back without parsing or validating the request
again; and its chunks, cut from it by examples.

The file holds the job's arrays (``a0``, ``a1``, ...) and its other fields as JSON (``job``),
arrays referred to by index; tuples and dicts are tagged so they come back as they went in.
No pickles: a job file is data, never code.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
from typing import Any

import numpy as np
from pydantic import BaseModel

from service.core.work import Job

_ARRAY, _TUPLE, _DICT = "__array__", "__tuple__", "__dict__"
#: fields a stored job does not keep (set again for each chunk as it runs)
_TRANSIENT = ("id", "deadline", "key", "request_id", "background")


def _pack(value: Any, arrays: list[np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        arrays.append(value)
        return {_ARRAY: len(arrays) - 1}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {_TUPLE: [_pack(v, arrays) for v in value]}
    if isinstance(value, list):
        return [_pack(v, arrays) for v in value]
    if isinstance(value, dict):
        return {_DICT: [[k, _pack(v, arrays)] for k, v in value.items()]}
    if isinstance(value, BaseModel):
        return _pack(value.model_dump(), arrays)
    if isinstance(value, enum.Enum):
        return value.value
    return value


def _unpack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, list):
        return [_unpack(v, arrays) for v in value]
    if isinstance(value, dict):
        if _ARRAY in value:
            return arrays[f"a{value[_ARRAY]}"]
        if _TUPLE in value:
            return tuple(_unpack(v, arrays) for v in value[_TUPLE])
        return {k: _unpack(v, arrays) for k, v in value[_DICT]}
    return value


def dumps(job: Job) -> bytes:
    """The job's file contents."""
    arrays: list[np.ndarray] = []
    fields = {
        f.name: _pack(getattr(job, f.name), arrays)
        for f in dataclasses.fields(job)
        if f.name not in _TRANSIENT
    }
    buf = io.BytesIO()
    named = {f"a{i}": a for i, a in enumerate(arrays)}
    np.savez(buf, job=np.array(json.dumps(fields)), **named)  # type: ignore[arg-type]
    return buf.getvalue()


def loads(data: bytes) -> Job:
    """The job a file holds (``dumps``'s inverse; its transient fields at their defaults)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k != "job"}
        fields = json.loads(str(z["job"]))
    values = {k: _unpack(v, arrays) for k, v in fields.items()}
    return Job(id=0, deadline=0.0, **values)


def _rows(value: Any, n: int, start: int, stop: int) -> Any:
    """Per-example arrays (``n`` rows, ``n`` > 1) cut to ``[start, stop)``; others whole (one
    row broadcasts; a distribution of baselines is sampled by every chunk)."""
    if isinstance(value, np.ndarray):
        per_example = n > 1 and value.ndim > 0 and value.shape[0] == n
        return value[start:stop] if per_example else value
    if isinstance(value, tuple):
        return tuple(_rows(v, n, start, stop) for v in value)
    if isinstance(value, dict):
        return {k: _rows(v, n, start, stop) for k, v in value.items()}
    return value


def chunk(job: Job, start: int, stop: int) -> Job:
    """The job's examples ``[start, stop)`` as a job of their own."""
    n, size = job.n, stop - start
    target = job.target
    if target is not None and target["kind"] in ("per_example", "per_example_tuple"):
        target = {**target, "rows": target["rows"][start:stop]}
    return dataclasses.replace(
        job,
        arrays=tuple(a[start:stop] for a in job.arrays),
        texts=job.texts[start:stop],
        target=target,
        baselines=_rows(job.baselines, n, start, stop),
        params=_rows(job.params, n, start, stop),
        n=size,
        cost=max(1, job.cost * size // max(1, n)),
        key=None,  # a job's chunks are never merged with other work
    )
