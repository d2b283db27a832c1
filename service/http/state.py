"""What the routes share: settings, model specs, the pool and the metrics (one per app)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from model_registry.spec import ModelSpec
from service.core.errors import UnknownModel
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.jobs.runner import JobRunner
from service.pool.pool import WorkerPool


@dataclass
class AppState:
    settings: Settings
    specs: dict[str, ModelSpec]
    pool: WorkerPool
    telemetry: Telemetry
    method_names: frozenset[str]
    #: attribution jobs (None: a server without workers)
    jobs: JobRunner | None = None

    def spec(self, model_id: str) -> ModelSpec:
        try:
            return self.specs[model_id]
        except KeyError:
            raise UnknownModel(
                f"unknown model {model_id!r}; served models: {sorted(self.specs)}",
                loc=("path", "model_id"),
            ) from None


async def get_state(request: Request) -> AppState:
    """Async on purpose: FastAPI runs plain-def dependencies in a thread, a hop per request."""
    state: AppState = request.app.state.attrserve
    return state
