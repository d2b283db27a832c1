"""A model's concept sets (persisted example inputs) and TCAV queries on them (CONTRACT 7.1).

Layout under ``data_dir``: ``concepts/<model>/<name>.npz``, one file per set holding its
decoded inputs (``x0``, ``x1``, ... or ``texts``) and ``meta`` (name, n, shape, updated,
digest), written whole to a temporary file and renamed, so a reader never sees half a set.
The worker reads a set's file itself, and only when its activations at a layer are not cached
yet (``service.concepts.work``): the query carries names and digests, not examples.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from base64 import b64encode
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service.concepts.protocol import NAME_RULE, TCAVRequest, TCAVResponse, read_set, valid_name
from service.concepts.work import ConceptQuery
from service.core.errors import InvalidRequest, NotFound, ServiceError, UnsupportedMethod
from service.core.files import atomic_write
from service.core.settings import Settings
from service.core.work import Work, new_id
from service.http.state import AppState
from service.serving.capability import Capability, Done
from service.wire import codec, targets

log = logging.getLogger("attrserve.concepts")


def model_dir(data_dir: str, model_id: str, part: str) -> Path:
    """A model's directory of ``part`` ("concepts", "cache") under ``data_dir``."""
    return Path(data_dir) / part / quote(model_id, safe="")


def _path(settings: Settings, spec: ModelSpec, name: str) -> Path:
    if not valid_name(name):
        raise InvalidRequest(
            f"concept name {name!r} is not valid: {NAME_RULE}, not . or ..",
            loc=("path", "name"),
        )
    return model_dir(settings.data_dir, spec.id, "concepts") / f"{name}.npz"


def digest(arrays: tuple[np.ndarray, ...], texts: tuple[Any, ...]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(json.dumps([str(a.dtype), list(a.shape)]).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(json.dumps(list(texts)).encode())
    return h.hexdigest()


#: sets' descriptions by (file, size, mtime): a query names its sets without reopening them
_METAS: dict[tuple[str, int, int], dict[str, Any]] = {}


def _meta(path: Path) -> dict[str, Any]:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _METAS:
        with np.load(path, allow_pickle=False) as f:
            if len(_METAS) > 4096:
                _METAS.clear()
            _METAS[key] = json.loads(str(f["meta"]))
    return dict(_METAS[key])


def put(settings: Settings, spec: ModelSpec, name: str, raw: Any) -> tuple[dict[str, Any], bool]:
    """Store the set (its inputs checked as the attributions route checks them): its
    description, and whether it is new."""
    path = _path(settings, spec, name)
    _check_kind(spec)
    inputs = codec.decode_within(raw, spec, settings)
    meta = {
        "name": name,
        "n": inputs.n,
        "shape": None if inputs.texts else [list(a.shape[1:]) for a in inputs.arrays],
        "updated": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "digest": digest(inputs.arrays, inputs.texts),
    }
    members = {f"x{i}": a for i, a in enumerate(inputs.arrays)}
    members["texts"] = np.array(
        json.dumps([list(t) if isinstance(t, tuple) else t for t in inputs.texts])
    )
    members["meta"] = np.array(json.dumps(meta))
    created = not path.exists()
    atomic_write(path, lambda f: np.savez(f, **members))  # type: ignore[arg-type]
    return meta, created


def store_builtin(settings: Settings, specs: list[ModelSpec]) -> list[str]:
    """The built-in demo models' concept sets, stored where a model has none of that name
    (a set the user replaced stays theirs); the names stored. The server's own data: the
    per-request limits do not apply, and a set that cannot be stored is logged, not fatal."""
    from model_registry import builtin

    own = settings.model_copy(update={"max_tensor_elements": 2**62, "max_batch_size": 2**31})
    stored = []
    for spec in specs:
        kind, _, name = spec.source.partition(":")
        found = builtin.BUILTINS.get(name) if kind == "builtin" else None
        if found is None or found.concepts is None:
            continue
        names, make = found.concepts
        if all(_path(own, spec, n).exists() for n in names):
            continue  # the usual start: nothing to generate
        for set_name, examples in make().items():
            if _path(own, spec, set_name).exists():
                continue
            a = np.ascontiguousarray(examples.numpy())
            raw = {"dtype": str(a.dtype), "shape": list(a.shape)}
            try:
                put(own, spec, set_name, {**raw, "b64": b64encode(a.tobytes()).decode("ascii")})
            except (ServiceError, OSError) as exc:
                log.warning("attrserve: %s: concept set %s not stored: %s", spec.id, set_name, exc)
                continue
            stored.append(f"{spec.id}/{set_name}")
    return stored


def _unknown(spec: ModelSpec, name: str) -> NotFound:
    return NotFound(
        f"model {spec.id!r} has no concept set {name!r} (PUT /v1/models/{spec.id}/concepts/"
        f"{name} stores one)",
        loc=("path", "name"),
    )


def listing(settings: Settings, spec: ModelSpec) -> list[dict[str, Any]]:
    folder = model_dir(settings.data_dir, spec.id, "concepts")
    found = []
    for path in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
        try:
            found.append(_meta(path))
        except (OSError, ValueError, KeyError):  # being replaced, or not ours: skipped
            continue
    return found


def read(settings: Settings, spec: ModelSpec, name: str) -> dict[str, Any]:
    """The set's description and its inputs (lists, or the texts)."""
    path = _path(settings, spec, name)
    if not path.is_file():
        raise _unknown(spec, name)
    meta, arrays, texts = read_set(str(path))
    shown = [a.tolist() for a in arrays]
    meta["inputs"] = (
        [list(t) if isinstance(t, tuple) else t for t in texts]
        if texts
        else (shown[0] if len(shown) == 1 else shown)
    )
    return meta


def delete(settings: Settings, spec: ModelSpec, name: str) -> None:
    path = _path(settings, spec, name)
    try:
        path.unlink()
    except FileNotFoundError:
        raise _unknown(spec, name) from None


def _check_kind(spec: ModelSpec) -> None:
    if not task_of(spec).supports("tcav"):
        raise UnsupportedMethod(
            f"model {spec.id!r} ({task_of(spec).family}) has no layers to read concepts at; "
            "TCAV serves models of tensors, texts or images",
            loc=("path", "model_id"),
        )


def _sets(settings: Settings, spec: ModelSpec, names: list[str], field: str) -> dict[str, Any]:
    found = {}
    for i, name in enumerate(names):
        if name in found:
            raise InvalidRequest(f"{name!r} is named twice", loc=("body", field, i))
        path = _path(settings, spec, name)
        if not path.is_file():
            raise _unknown(spec, name)
        found[name] = {"path": str(path), "digest": _meta(path)["digest"]}
    return found


def tcav_job(
    settings: Settings, spec: ModelSpec, req: TCAVRequest, deadline: float
) -> ConceptQuery:
    """Every check that needs no model: the query as a job for the worker."""
    _check_kind(spec)
    layers = req.layers if req.layers is not None else list(spec.layers)
    if not layers:
        raise InvalidRequest(
            f"model {spec.id!r} lists no layers; name the layers to read concepts at",
            loc=("body", "layers"),
        )
    both = sorted(set(req.concepts) & set(req.random_concepts))
    if both:
        raise InvalidRequest(
            f"{both} are both concepts and random sets; name each set once",
            loc=("body", "random_concepts"),
        )
    concepts = _sets(settings, spec, req.concepts, "concepts")
    randoms = _sets(settings, spec, req.random_concepts, "random_concepts")
    inputs = codec.decode_within(req.inputs, spec, settings)
    target = targets.resolve(req.target, spec.output, inputs.n)
    return ConceptQuery(
        id=new_id(),
        model_id=spec.id,
        n=inputs.n,
        arrays=inputs.arrays,
        target=target,
        seed=req.params.seed,
        study={
            "concepts": concepts,
            "random_concepts": randoms,
            "layers": list(layers),
            "classifier": req.params.classifier,
            "alpha": req.params.alpha,
            "cache": str(model_dir(settings.data_dir, spec.id, "cache")),
            "version": spec.version,
        },
        texts=inputs.texts,
        deadline=deadline,
        cost=inputs.n * (1 + len(layers)),
        max_tokens=settings.max_text_tokens,
    )


class TCAV(Capability[TCAVRequest]):
    """``POST /v1/models/{model_id}/tcav``: TCAV scores of concept sets at layers."""

    operation = "tcav"
    stem = "tcav"
    request = TCAVRequest
    response = TCAVResponse
    job_operation_id = "submitTcavJob"
    job_summary = (
        "Queue a TCAV query as a job (checked now, run whole: its scores count over all the "
        "examples; persisted); ``GET /v1/jobs/{job_id}/result`` answers as the tcav route does."
    )

    async def start(self, state: AppState) -> None:
        """The built-in demo models' concept sets, stored for TCAV."""
        await asyncio.to_thread(store_builtin, state.settings, list(state.specs.values()))

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: TCAVRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        # the sets' files read, the inputs decoded (images resized): off the event loop
        return tcav_job(settings, spec, req, deadline)

    def answer(self, done: Done) -> dict[str, Any]:
        study = done.reply.study or {}
        return {
            "model_id": done.spec.id,
            "model_version": done.spec.version,
            "scores": study["scores"],
            "computed": study["computed"],
            "timing_ms": done.timing_ms,
        }


TCAV_OPERATION = TCAV()
