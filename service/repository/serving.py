"""The model repository (Triton's repository extension): what is served, load and unload.

``load`` re-reads the model's entry from models.toml (the built-in registry when the server
has none), so a changed or a newly added entry is served without a restart; the pool starts it
beside the version serving now and swaps them once it is ready (``WorkerPool.load``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import model_registry
from model_registry.spec import ModelSpec
from service import kinds
from service.compat import kserve
from service.core.errors import InvalidRequest, LoadFailed, UnknownModel
from service.core.settings import Settings
from service.pool.pool import FAILED, LOADING, READY, UNLOADED, WorkerPool

TRITON_STATES = {READY: "READY", LOADING: "LOADING", FAILED: "UNAVAILABLE", UNLOADED: "UNAVAILABLE"}


def index(pool: WorkerPool, ready_only: bool) -> list[dict[str, Any]]:
    """Every model the server knows: name, version, Triton's state and the reason."""
    rows = []
    for model_id, s in pool.states().items():
        if ready_only and s["state"] != READY:
            continue
        row = {"name": model_id, "version": pool.specs[model_id].version}
        row["state"] = TRITON_STATES[s["state"]]
        row["reason"] = s["reason"] or ""
        rows.append(row)
    return rows


async def entry(settings: Settings, model_id: str) -> ModelSpec:
    """``model_id``'s entry as models.toml says now (the whole file checked, as at start)."""
    where = settings.models or "the built-in registry"
    try:
        specs = await asyncio.to_thread(model_registry.load_specs, settings.models)
    except model_registry.RegistryError as exc:
        raise LoadFailed(f"cannot load model {model_id!r}: {where} is not valid: {exc}") from None
    spec = next((s for s in specs if s.id == model_id), None)
    if spec is None:
        raise UnknownModel(
            f"{where} has no model {model_id!r}; it declares {sorted(s.id for s in specs)}",
            loc=("path", "model_name"),
        )
    try:
        kserve.check_explanation(spec, settings)
        kinds.check_defaults(spec, settings)
    except ValueError as exc:
        raise LoadFailed(str(exc)) from None
    return spec


async def load(settings: Settings, pool: WorkerPool, model_id: str, body: Any) -> None:
    """Serve ``model_id`` as models.toml declares it now (a failed load leaves the version
    serving before in place)."""
    parameters = body.get("parameters") if isinstance(body, dict) else None
    if parameters:
        raise InvalidRequest(
            "load parameters (a config or files) are not taken: models.toml is the model's "
            "configuration; edit its entry and load again",
            loc=("body", "parameters"),
        )
    await pool.load(await entry(settings, model_id))


async def unload(pool: WorkerPool, model_id: str) -> None:
    """Stop serving ``model_id``: requests in flight finish, later ones get 404."""
    if model_id not in pool.specs:
        raise UnknownModel(
            f"unknown model {model_id!r}; the server knows {sorted(pool.specs)}",
            loc=("path", "model_name"),
        )
    await pool.unload(model_id)
