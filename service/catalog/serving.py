"""Serving the catalogue: models as the registry declares them, methods as the engine lists them."""

from __future__ import annotations

from typing import Any

from model_registry.spec import ModelSpec
from service import kinds
from service.wire.catalog import (
    ExportedInfo,
    InputInfo,
    ModelInfo,
    OutputInfo,
)


def model_info(spec: ModelSpec, loaded: dict[str, Any] | None, state: dict[str, Any]) -> ModelInfo:
    """``loaded``: what the workers report of the model (None before they have loaded it);
    ``state``: its state, reason and group (``WorkerPool.states``)."""
    got = loaded or {}
    step = spec.exported
    ready = state["state"] == "ready"
    return ModelInfo(
        id=spec.id,
        name=spec.id,
        ready=ready,
        state=state["state"],
        reason=state["reason"],
        group=state["group"],
        version=spec.version,
        description=spec.description,
        device=str((loaded or {}).get("device", spec.device)),
        inputs=[
            InputInfo(
                name=i.name,
                dtype=i.dtype,
                shape=list(i.shape),
                features=None if i.features is None else list(i.features),
            )
            for i in spec.inputs
        ],
        output=OutputInfo(shape=list(spec.output.shape), labels=list(spec.output.labels)),
        layers=list(spec.layers),
        embedding_layer=spec.embedding_layer,
        tokenizer=bool((loaded or {}).get("tokenizer", kinds.of(spec).catalogue(spec).tokenizer)),
        images=spec.images is not None,
        predicts=kinds.of(spec).catalogue(spec).predicts,
        methods=kinds.of(spec).catalogue(spec).methods,
        exported=None
        if step is None
        else ExportedInfo(method=step.method, params=step.params, target=step.target),
        compiled=bool(got.get("compiled", False)),
        compile_error=got.get("compile_error"),
        compile_ms=got.get("compile_ms"),
        verification=got.get("verification"),
        precision=got.get("precision")
        or {"default": spec.precision or "float32", "probe": {}, "chosen": None},
        not_ready_reason=None if ready else state["reason"],
        predictor=predictor(spec, state.get("predictor")),
        remote=remote(spec, state.get("predictor")),
        kind=spec.task,
        defaults={m: dict(p) for m, p in spec.defaults.items()},
    )


def remote(spec: ModelSpec, seen: dict[str, Any] | None) -> dict[str, Any] | None:
    """A remote model's ``{url, healthy, last_error}`` (CONTRACT 8.2): ``healthy`` null
    before the first call, then whether the last call succeeded."""
    if spec.remote is None:
        return None
    seen = seen or {}
    called = seen.get("last_ok_at") is not None or seen.get("last_error_at") is not None
    return {
        "url": spec.remote.url,
        "healthy": (seen.get("failures_in_a_row", 0) == 0) if called else None,
        "last_error": seen.get("last_error"),
    }


def predictor(spec: ModelSpec, seen: dict[str, Any] | None) -> dict[str, Any] | None:
    """A remote model's predictor and how it answered lately (None: not a remote model)."""
    if spec.remote is None:
        return None
    seen = seen or {}
    return {
        "predictor": spec.remote.describe(),
        "healthy": seen.get("failures_in_a_row", 0) == 0,
        "failures_in_a_row": seen.get("failures_in_a_row", 0),
        "last_ok_at": seen.get("last_ok_at"),
        "last_error": seen.get("last_error"),
        "last_error_at": seen.get("last_error_at"),
    }
