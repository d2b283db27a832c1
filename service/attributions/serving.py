"""Serving attributions: the request's kind of model turns it into work, the pool runs it within
the deadline (cancelled when it passes or the client goes), the kind shapes the answer, and the
pictures are drawn off the event loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service import kinds
from service.core.errors import (
    UnsupportedMethod,
)
from service.core.offload import offload_if
from service.core.settings import Settings
from service.core.work import Attribution, Reply, Work
from service.kinds.base import timing
from service.pool.pool import WorkerPool
from service.serving import pictures
from service.serving.run import budget_ms, run
from service.wire.attributions import AttributionRequest


def build_job(
    settings: Settings,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline: float,
    request_id: str = "",
) -> Work:
    """Every check that needs no model (the model's kind decides): the request as a job, or a
    4xx ServiceError. The params a request leaves out take the model's models.toml
    ``defaults`` first."""
    kind = kinds.of(spec)
    if spec.defaults.get(req.method):
        params = kinds.with_defaults(spec, req.method, req.params)
        req = req.model_copy(update={"params": params})
    if req.metrics is not None and req.metrics.asked() and not kind.catalogue(spec).predicts:
        raise UnsupportedMethod(
            f"model {spec.id!r} is a {kind.name} model: its attributions cannot be scored "
            "with metrics (they need a tensor model's forward)",
            loc=("body", "metrics"),
        )
    job = kind.build_job(settings, spec, req, deadline, request_id)
    if req.render is not None:  # before the work: examples in range, a known colormap
        pictures.examples(req.render, job.n, kind.catalogue(spec).pictures)
    return job


async def attribute(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline_ms: float | None,
    started: float,
    request_id: str = "",
    disconnected: Callable[[], Awaitable[Any]] | None = None,
    offload: bool = False,
    predictions: bool = False,
) -> tuple[dict[str, Any], Work, Reply]:
    """Validate, queue, wait, answer. ``offload``: a large request, decoded in a thread so the
    event loop keeps serving others (health checks above all) meanwhile. ``predictions``: the
    reply also carries the model's whole output per example (KServe and OIP explain)."""
    kind = kinds.of(spec)
    budget = budget_ms(settings, deadline_ms, req.deadline_ms)
    deadline = time.time() + budget / 1e3
    if predictions and not kind.catalogue(spec).predicts:
        raise kind.no_predictions(spec)
    build = partial(build_job, settings, spec, req, deadline, request_id)
    # large bodies, and images (decoded and resized: milliseconds each), off the event loop
    job = await offload_if(offload or spec.images is not None, build)
    if predictions and isinstance(job, Attribution):
        job.predictions = True
    advice = ""
    if task_of(spec).jobs:
        advice = (
            f"Ask a longer deadline (up to {settings.max_deadline_ms:g} ms), or submit the same "
            f"body as a job, which has none: POST /v1/models/{spec.id}/attribution-jobs "
            f"(this request's estimated cost: {job.cost} forward rows)"
        )
    reply, queue_ms = await run(pool, job, budget, started, disconnected, advice)
    body = kind.response(spec, req, job, reply, timing(queue_ms, reply.compute_ms, started))
    if req.render is not None:  # PNG encoding takes milliseconds: off the event loop
        title = f"{spec.id} · {body['method']}"
        body["renders"] = await asyncio.to_thread(
            pictures.draw, req.render, spec, job, kind.drawn(reply), title
        )
    return body, job, reply
