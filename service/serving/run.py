"""Work through the pool within its deadline, as every capability's serving runs it: queued,
waited for (cancelled when the deadline passes or the client goes), its error raised."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from service.core.errors import DeadlineExceeded, RequestCancelled, ServiceError
from service.core.settings import Settings
from service.core.tracing import record_work
from service.core.work import Reply, Work
from service.pool.pool import Entry, WorkerPool


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


def late(budget: float, started: float, advice: str = "") -> DeadlineExceeded:
    """The 504 of a request past its deadline: how long it had, how long it was here, and
    what to do (``advice``; by default, ask a longer deadline)."""
    here = time.perf_counter() - started
    advice = advice or (
        "ask a longer deadline (the X-Deadline-Ms header or the body's deadline_ms) if the "
        "work needs it"
    )
    return DeadlineExceeded(
        f"the request did not finish within its deadline of {budget:g} ms (it was here "
        f"{here:.1f} s, queued and computing); the work was stopped. {advice}"
    )


async def run(
    pool: WorkerPool,
    job: Work,
    budget: float,
    started: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
    advice: str = "",
) -> tuple[Reply, float]:
    """Queue the job and wait for it (cancelled at the deadline or when the client goes);
    the reply and the time it queued (ms). ``advice``: what a 504 suggests (``late``)."""
    submitted = time.perf_counter()
    entry = pool.submit(job)
    remaining = budget / 1e3 - (submitted - started)
    try:
        reply = await wait(pool, entry, remaining, disconnected)
    except DeadlineExceeded:
        raise late(budget, started, advice) from None
    record_work(submitted, entry.dispatched, reply)  # spans, when on: after the fact
    if reply.error is not None:
        err = ServiceError.from_data(reply.error)
        if isinstance(err, DeadlineExceeded):  # a piece that had not started yet, say
            raise late(budget, started, advice) from None
        raise err
    queue_ms = 0.0
    if reply.compute_ms:
        queue_ms = max(0.0, (time.perf_counter() - started) * 1e3 - reply.compute_ms)
    return reply, queue_ms
