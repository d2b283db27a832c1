"""What the routes share: settings, model specs, the pool and the metrics (one per app)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from model_registry.spec import ModelSpec
from service.core.errors import UnknownModel
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.pool.pool import WorkerPool


@dataclass
class AppState:
    settings: Settings
    specs: dict[str, ModelSpec]
    pool: WorkerPool
    telemetry: Telemetry
    method_names: frozenset[str]
    #: the capabilities' own parts, set by the app (None: a server without workers); each
    #: capability reads its own, typed (``service.jobs.router.runner``,
    #: ``service.influence.router.indexes``): this layer sits below them
    #: attribution jobs (``service.jobs.runner.JobRunner``)
    jobs: Any = None
    #: influence indexes of the models that serve influence
    #: (``service.influence.indexes.InfluenceIndexes``)
    influence: Any = None
    #: attribution drift monitors (``service.monitor``: the store, its gauge, its flusher)
    monitors: Any = None
    #: what sees every synchronous answer (``tap(operation, done)``, after it is answered):
    #: the drift monitors' live windows; a tap never fails a request
    taps: list[Any] = field(default_factory=list)

    def spec(self, model_id: str) -> ModelSpec:
        """The spec of a served model; 404 for one unknown or unloaded."""
        spec = self.known(model_id)
        if model_id in self.pool.unloaded:
            raise UnknownModel(
                f"model {model_id!r} is unloaded; load it again with "
                f"POST /v2/repository/models/{model_id}/load",
                loc=("path", "model_id"),
            )
        return spec

    def healthy(self, model_id: str) -> ModelSpec:
        """The spec of a model to compute with: 404 as ``spec``, 503 for a model that failed
        (to load, its checks, or its worker crashed), before anything else is checked."""
        spec = self.spec(model_id)
        self.pool.check(model_id)
        return spec

    def known(self, model_id: str) -> ModelSpec:
        """The spec of a model served or unloaded; 404 for one unknown."""
        try:
            return self.specs[model_id]
        except KeyError:
            served = sorted(m for m in self.specs if m not in self.pool.unloaded)
            raise UnknownModel(
                f"unknown model {model_id!r}; served models: {served}",
                loc=("path", "model_id"),
            ) from None


async def get_state(request: Request) -> AppState:
    """Async on purpose: FastAPI runs plain-def dependencies in a thread, a hop per request."""
    state: AppState = request.app.state.attrserve
    return state
