"""A job as it is stored: its validated, decoded work (an ``Attribution``: arrays, texts,
resolved target, baselines, params; or an attack, a counterfactual search, a part of an
influence index) in one ``.npz`` file, read back without parsing or validating the request
again (its chunks are cut by ``Work.cut``).

The file holds the work's type by name (``type``: one of ``WORK_TYPES``), its arrays (``a0``,
``a1``, ...) and its other fields as JSON (``job``), arrays referred to by index; tuples and
dicts are tagged so they come back as they went in. No pickles: a job file is data, never code.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import json
from typing import Any

import numpy as np
from pydantic import BaseModel

from model_registry.spec import ModelSpec
from model_registry.tasks import TASKS
from service.core.work import WORK_TYPES, Work

_ARRAY, _TUPLE, _DICT = "__array__", "__tuple__", "__dict__"
#: fields a stored job does not keep (set again for each chunk as it runs; a job's results
#: draw no pictures, so not the encoded images either)
_TRANSIENT = ("id", "deadline", "key", "request_id", "background", "images")


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


def fingerprint(spec: ModelSpec) -> str:
    """What a stored job was validated against: the model's version, kind and inputs."""
    inputs = [(i.name, i.dtype, list(i.shape)) for i in spec.inputs]
    # the kind as served: a Hugging Face classifier's task is a tensor model, as it was named
    # when jobs stored before the tasks were kinds were validated
    kind = TASKS[spec.task].family
    return json.dumps([spec.version, kind, spec.exported is not None, inputs])


#: files written before the type was stored: the type their ``method`` field implies
_LEGACY = {
    "influence_index": "InfluenceIndexPart",
    "attack": "Attack",
    "counterfactual": "Counterfactual",
}


def dumps(job: Work, model: str = "") -> bytes:
    """The job's file contents; ``model``: the fingerprint of its model's spec."""
    arrays: list[np.ndarray] = []
    fields = {
        f.name: _pack(getattr(job, f.name), arrays)
        for f in dataclasses.fields(job)
        if f.name not in _TRANSIENT
    }
    buf = io.BytesIO()
    named: dict[str, np.ndarray] = {f"a{i}": a for i, a in enumerate(arrays)}
    named["job"] = np.array(json.dumps(fields))
    named["type"] = np.array(type(job).__name__)
    named["model"] = np.array(model)
    np.savez(buf, **named)  # type: ignore[arg-type]
    return buf.getvalue()


def loads(data: bytes) -> tuple[Work, str]:
    """The work a file holds (``dumps``'s inverse; its transient fields at their defaults) and
    its model's fingerprint; a KeyError for a type this version does not know. A type is
    known once its module is imported: the app imports every capability that runs jobs."""
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in ("job", "model", "type")}
        fields = json.loads(str(z["job"]))
        model = str(z["model"])
        name = str(z["type"]) if "type" in z.files else None
    if name is None:
        name = _LEGACY.get(fields.get("method"), "Attribution")
    kind = WORK_TYPES[name]
    known = {f.name for f in dataclasses.fields(kind)}  # an older file's other fields go
    values = {k: _unpack(v, arrays) for k, v in fields.items() if k in known}
    target = values.get("target")
    if isinstance(target, dict) and "kind" in target:  # stored before targets had a "form"
        values["target"] = {("form" if k == "kind" else k): v for k, v in target.items()}
    return kind(id=0, deadline=0.0, **values), model
