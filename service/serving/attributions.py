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
from service import kinds
from service.core.errors import (
    DeadlineExceeded,
    RequestCancelled,
    ServiceError,
    UnsupportedMethod,
)
from service.core.offload import offload as in_thread
from service.core.settings import Settings
from service.core.tracing import record_work
from service.core.work import Job, Reply
from service.kinds.base import timing
from service.pool.pool import Entry, WorkerPool
from service.serving import pictures
from service.wire.attributions import AttributionRequest


def build_job(
    settings: Settings,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline: float,
    request_id: str = "",
) -> Job:
    """Every check that needs no model (the model's kind decides): the request as a job, or a
    4xx ServiceError."""
    kind = kinds.of(spec)
    if req.metrics is not None and req.metrics.asked() and not kind.predicts:
        raise UnsupportedMethod(
            f"model {spec.id!r} is a {kind.name} model: its attributions cannot be scored "
            "with metrics (they need a tensor model's forward)",
            loc=("body", "metrics"),
        )
    job = kind.build_job(settings, spec, req, deadline, request_id)
    if req.render is not None:  # before the work: examples in range, a known colormap
        pictures.examples(req.render, job.n, kind.pictures(spec))
    return job


async def wait(
    pool: WorkerPool,
    entry: Entry,
    timeout: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
) -> Reply:
    """The reply, or cancel the work when the deadline passes (504) or the client goes (499)."""
    watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
    waits: set[asyncio.Future[Any]] = {entry.future} if watcher is None else {entry.future, watcher}
    try:
        await asyncio.wait(waits, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if watcher is not None:
            watcher.cancel()
    if entry.future.done():
        return entry.future.result()
    pool.cancel(entry)
    if watcher is not None and watcher.done() and not watcher.cancelled():
        raise RequestCancelled("the client closed the connection; the work was stopped")
    raise DeadlineExceeded("the request did not finish within its deadline; the work was stopped")


def budget_ms(settings: Settings, *given: float | None) -> float:
    """The request's time budget: the first deadline given (header, body), else the default."""
    chosen = next((g for g in given if g), settings.deadline_ms)
    return min(chosen, settings.max_deadline_ms)


async def run(
    pool: WorkerPool,
    job: Job,
    budget: float,
    started: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
) -> tuple[Reply, float]:
    """Queue the job and wait for it (cancelled at the deadline or when the client goes);
    the reply and the time it queued (ms)."""
    submitted = time.perf_counter()
    entry = pool.submit(job)
    remaining = budget / 1e3 - (submitted - started)
    try:
        reply = await wait(pool, entry, remaining, disconnected)
    except DeadlineExceeded:
        raise DeadlineExceeded(
            f"the request did not finish within its deadline of {budget:g} ms; the work was stopped"
        ) from None
    record_work(submitted, entry.dispatched, reply)  # spans, when on: after the fact
    if reply.error is not None:
        raise ServiceError.from_data(reply.error)
    queue_ms = 0.0
    if reply.compute_ms:
        queue_ms = max(0.0, (time.perf_counter() - started) * 1e3 - reply.compute_ms)
    return reply, queue_ms


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
) -> tuple[dict[str, Any], Job, Reply]:
    """Validate, queue, wait, answer. ``offload``: a large request, decoded in a thread so the
    event loop keeps serving others (health checks above all) meanwhile. ``predictions``: the
    reply also carries the model's whole output per example (KServe and OIP explain)."""
    kind = kinds.of(spec)
    budget = budget_ms(settings, deadline_ms, req.deadline_ms)
    deadline = time.time() + budget / 1e3
    if predictions and not kind.predicts:
        raise kind.no_predictions(spec)
    build = partial(build_job, settings, spec, req, deadline, request_id)
    # large bodies, and images (decoded and resized: milliseconds each), off the event loop
    job = await in_thread(build) if offload or spec.images else build()
    job.predictions = predictions
    reply, queue_ms = await run(pool, job, budget, started, disconnected)
    body = kind.response(spec, req, job, reply, timing(queue_ms, reply.compute_ms, started))
    if req.render is not None:  # PNG encoding takes milliseconds: off the event loop
        title = f"{spec.id} · {body['method']}"
        body["renders"] = await asyncio.to_thread(
            pictures.draw, req.render, spec, job, kind.drawn(reply), title
        )
    return body, job, reply
