"""Serving predictions: the model's outputs for inputs (KServe ``:predict``, OIP ``infer``),
through the same codec checks, worker pool, batching and cancellation as attributions."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from model_registry.spec import ModelSpec
from service import kinds
from service.core.offload import offload_if
from service.core.settings import Settings
from service.core.work import Reply
from service.pool.pool import WorkerPool
from service.serving.capability import budget_ms, execute


async def predict(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    inputs: Any,
    deadline_ms: float | None,
    started: float,
    request_id: str = "",
    disconnected: Callable[[], Awaitable[Any]] | None = None,
    offload: bool = False,
) -> Reply:
    """The model's outputs for ``inputs`` (any form the attributions route takes)."""
    budget = budget_ms(settings, deadline_ms)
    deadline = time.time() + budget / 1e3
    build = partial(kinds.of(spec).predict_work, settings, spec, inputs, deadline, request_id)
    work = await offload_if(offload or spec.images is not None, build)  # as attributions
    reply, _ = await execute(pool, work, budget, started, disconnected)
    return reply
