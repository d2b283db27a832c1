"""``Capability``: the one serving template. Every operation a model serves (attributions,
context attributions, attacks, counterfactuals, TCAV, influence, ...) is a subclass in its own
folder that says how a request becomes work (``build``) and how the work's reply is answered
(``answer``); the template does the rest, the same for all:

- the route's policy: the model must be served and healthy (``spec``), the request's time
  budget (the deadline header, else the body's ``deadline_ms``, else the server's default, at
  most the server's limit), decoding off the event loop (``offloaded``);
- the pool: the work queued, waited for, cancelled when the deadline passes (504) or the client
  hangs up (499), its error raised as the service's; streamed events where offered (``stream``);
- jobs: the same body at ``POST /v1/models/{id}/{stem}-jobs`` is checked and built whole under
  the job limits, stored, run in chunks as background work, and answered by the same
  ``answer`` once its chunks are joined (``result``);
- metrics and log labels (``observe``: model, operation, method, status; latency, compute) and
  timing (``timing_ms``).

This module is the only one that talks to the worker pool (``execute``, ``queue``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel
from starlette.types import Scope

from model_registry.spec import ModelSpec
from service.core.errors import (
    DeadlineExceeded,
    InvalidRequest,
    RequestCancelled,
    ServiceError,
)
from service.core.offload import offload_if
from service.core.settings import Section, Settings
from service.core.tracing import record_work
from service.core.work import Reply, Work
from service.http.observed import Observed
from service.http.problems import problem_body, to_service_error
from service.http.state import AppState
from service.kinds.base import timing
from service.pool.pool import Entry, WorkerPool

R = TypeVar("R", bound=BaseModel)
log = logging.getLogger("attrserve")


def tapped(state: AppState, operation: str, done: Done) -> None:
    """Every tap of the server sees a synchronous answer (a monitor's window); a tap's failure
    is logged, never the request's."""
    for tap in state.taps:
        try:
            tap(operation, done)
        except Exception:  # an observer must not fail the answer it observes
            log.exception("attrserve: a tap failed on %s of %s", operation, done.spec.id)


@dataclass(frozen=True)
class Done:
    """Work answered: what an operation's ``answer`` is built from, a synchronous reply or a
    finished job's chunks joined into one (``job``: then arrays are JSON and nothing is
    drawn)."""

    spec: ModelSpec
    work: Work
    reply: Reply
    #: what the answer needs of the request beyond the work (``Capability.options``): JSON
    options: dict[str, Any]
    timing_ms: dict[str, float]
    job: bool = False

    @property
    def model(self) -> tuple[str, str]:
        return self.spec.id, self.spec.version


class Jobs(Protocol):
    """The job runner as the template uses it (``service.jobs.runner.JobRunner``)."""

    async def submit_work(
        self,
        owner: str,
        spec: ModelSpec,
        build: Callable[[Settings], Work],
        size: int,
        *,
        operation: str,
        options: Callable[[Work], dict[str, Any]],
    ) -> Any: ...


class Capability(Generic[R]):
    """One operation: ``POST /v1/models/{model_id}/{operation}`` (and its job route,
    ``{stem}-jobs``). Subclasses set the class attributes and supply ``build`` and
    ``answer``; the other hooks have defaults that fit most."""

    #: the route's last segment, and a job's ``operation``: "attributions", "tcav", ...
    operation: ClassVar[str]
    #: the job route is ``{stem}-jobs``: "attribution", "tcav", ...
    stem: ClassVar[str]
    #: the request body's model and the response body's
    request: ClassVar[type[BaseModel]]
    response: ClassVar[type[BaseModel]]
    #: the job route's operationId in the API document
    job_operation_id: ClassVar[str]
    #: what the job route's document says of the job
    job_summary: ClassVar[str] = ""
    #: a job's result is answered from its chunks' replies joined (False: from its work
    #: alone, e.g. an influence index build, whose chunks are the index itself)
    chunked_result: ClassVar[bool] = True
    #: the operation's own settings, read from ``ATTRSERVE_*`` (``settings.section(...)``);
    #: None: it uses the server's alone
    section: ClassVar[type[Section] | None] = None

    # -- hooks: what an operation supplies ----------------------------------------------------
    async def start(self, state: AppState) -> None:
        """Set up what it serves from, once the workers and jobs have started (a server with
        workers only): files it keeps, indexes it builds."""

    async def stop(self, state: AppState) -> None:
        """Undo ``start``, before the jobs and the workers stop."""

    def method(self, req: R) -> str:
        """The metrics' and the access log's ``method`` label ("" where there is none)."""
        return ""

    def spec(self, state: AppState, model_id: str) -> ModelSpec:
        """The model it computes with: 404 unknown or unloaded, 503 failed."""
        return state.healthy(model_id)

    async def prepare(self, state: AppState, spec: ModelSpec, req: R) -> Any:
        """What ``build`` needs of the server beyond the settings (an influence index): asked
        on the event loop before the work is built."""
        return None

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: R,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        """Every check that needs no model, and the request as work (a 4xx ServiceError
        otherwise). Runs in a thread where ``offloaded``; under the job limits for a job."""
        raise NotImplementedError

    def offloaded(self, spec: ModelSpec, req: R) -> bool:
        """Whether the work is built off the event loop (files read, images decoded)."""
        return True

    def options(self, req: R, work: Work) -> dict[str, Any]:
        """What ``answer`` needs of the request beyond the work (kept with a job, as JSON)."""
        return {}

    def legacy_options(self, work: Work) -> dict[str, Any]:
        """``options`` of a job stored before jobs kept them (from its work)."""
        return {}

    def answer(self, done: Done) -> dict[str, Any]:
        """The response body (a job's result is the same, from its chunks joined)."""
        raise NotImplementedError

    async def finish(self, req: R, done: Done, body: dict[str, Any]) -> dict[str, Any]:
        """A synchronous answer's extras made after the work (pictures, files read), off the
        event loop where they take time."""
        return body

    def check_job(self, spec: ModelSpec, req: R) -> None:
        """What a job cannot do, refused before it is queued: pictures by default."""
        if getattr(req, "render", None) is not None:
            raise InvalidRequest(
                "render draws pictures in synchronous answers; jobs return tensors",
                loc=("body", "render"),
            )

    def advice(self, settings: Settings, spec: ModelSpec, work: Work) -> str:
        """What a 504 suggests: a longer deadline, or the job route, which has none."""
        return (
            f"Ask a longer deadline (up to {settings.max_deadline_ms:g} ms), or submit the same "
            f"body as a job, which has none: POST /v1/models/{spec.id}/{self.stem}-jobs "
            f"(this request's estimated cost: {work.cost} forward rows)"
        )

    # -- the template ---------------------------------------------------------------------------
    @contextmanager
    def observe(
        self, state: AppState, scope: Scope, model_id: str, method: str = ""
    ) -> Iterator[Observed]:
        """The request's metrics and log labels: model, this operation, ``method``, status."""
        with Observed(state, scope, model_id, self.operation, method) as seen:
            yield seen

    async def run(
        self,
        settings: Settings,
        pool: WorkerPool,
        spec: ModelSpec,
        req: R,
        *,
        started: float,
        deadline_ms: float | None = None,
        prepared: Any = None,
        request_id: str = "",
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        offload: bool = False,
        adjust: Callable[[Work], None] | None = None,
    ) -> Done:
        """The request's work through the pool within its budget, not yet answered;
        ``prepared``: what ``prepare`` gave, ``adjust``: a last change to the work before it
        is queued (KServe's explain asks for the predictions too)."""
        budget = budget_ms(settings, deadline_ms, getattr(req, "deadline_ms", None))
        deadline = time.time() + budget / 1e3
        build = partial(self.build, settings, spec, req, deadline, request_id, prepared)
        work = await offload_if(offload or self.offloaded(spec, req), build)
        if adjust is not None:
            adjust(work)
        advice = self.advice(settings, spec, work)
        reply, queue_ms = await execute(pool, work, budget, started, disconnected, advice)
        return Done(
            spec, work, reply, self.options(req, work), timing(queue_ms, reply.compute_ms, started)
        )

    async def serve(
        self,
        state: AppState,
        scope: Scope,
        model_id: str,
        req: R,
        *,
        deadline_ms: float | None = None,
        request_id: str = "",
        disconnected: Callable[[], Awaitable[Any]] | None = None,
        offload: bool = False,
    ) -> dict[str, Any]:
        """The route: observed, run, answered, finished."""
        with self.observe(state, scope, model_id, self.method(req)) as seen:
            spec = self.spec(state, model_id)
            done = await self.run(
                state.settings,
                state.pool,
                spec,
                req,
                started=seen.started,
                prepared=await self.prepare(state, spec, req),
                deadline_ms=deadline_ms,
                request_id=request_id,
                disconnected=disconnected,
                offload=offload,
            )
            body = await self.finish(req, done, self.answer(done))
            seen.computed(done.reply.compute_ms)
            tapped(state, self.operation, done)
            return body

    async def submit(self, state: AppState, owner: str, model_id: str, req: R, size: int) -> Any:
        """The job route: the request checked and built whole now (a bad one gets its 4xx
        here), under the job limits, then queued; the job's row. ``size``: the body's bytes."""
        jobs: Jobs | None = state.jobs
        if jobs is None:
            raise ServiceError("this server runs no jobs")
        spec = self.spec(state, model_id)
        self.check_job(spec, req)
        prepared = await self.prepare(state, spec, req)

        def build(settings: Settings) -> Work:
            return self.build(settings, spec, req, float("inf"), "", prepared)

        return await jobs.submit_work(
            owner, spec, build, size, operation=self.operation, options=partial(self.options, req)
        )

    def result(self, spec: ModelSpec, work: Work, reply: Reply, options: dict[str, Any],
               timing_ms: dict[str, float]) -> dict[str, Any]:  # fmt: skip
        """A finished job's body: the route's answer of its chunks joined."""
        return self.answer(Done(spec, work, reply, options, timing_ms, job=True))


# -- the pool, as every capability uses it -----------------------------------------------------
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


async def execute(
    pool: WorkerPool,
    work: Work,
    budget: float,
    started: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
    advice: str = "",
) -> tuple[Reply, float]:
    """Queue the work and wait for it (cancelled at the deadline or when the client goes);
    the reply and the time it queued (ms). ``advice``: what a 504 suggests (``late``)."""
    submitted = time.perf_counter()
    entry = pool.submit(work)
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


def queue(pool: WorkerPool, work: Work) -> Entry:
    """Work queued without a wait (a job's chunk, which the job runner awaits itself)."""
    return pool.submit(work)


def cancel(pool: WorkerPool, entry: Entry) -> None:
    """Queued or running work stopped (a job cancelled)."""
    pool.cancel(entry)


def stream(
    pool: WorkerPool,
    work: Work,
    deadline: float,
    budget: float,
    path: str,
    answer: Callable[[Reply, float], dict[str, Any]],
    sse: Callable[[str, Any], bytes],
) -> AsyncIterator[bytes]:
    """Work whose events go to the client as they come: an event ``token`` per event, then
    ``result`` (``answer(reply, queued_ms)``) or ``error`` (a problem object). The deadline
    stops the work after an ``error`` event; so does a client that goes (the iterator is
    closed)."""
    events: asyncio.Queue[Any] = asyncio.Queue()
    submitted = time.perf_counter()
    entry = pool.submit(work)
    entry.on_event = events.put_nowait

    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait(
                    {getter, entry.future},
                    timeout=max(0.0, deadline - time.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    yield sse("token", getter.result())
                    continue
                getter.cancel()
                if not entry.future.done():  # the deadline
                    pool.cancel(entry)
                    over = DeadlineExceeded(
                        f"the request did not finish within its deadline of {budget:g} ms; "
                        "the work was stopped"
                    )
                    yield sse("error", problem_body(over, path))
                    return
                break
            while not events.empty():  # events come before the reply: all are here
                yield sse("token", events.get_nowait())
            failure: BaseException | None = (
                RequestCancelled("the work was cancelled")
                if entry.future.cancelled()
                else entry.future.exception()
            )
            if failure is not None:  # the worker lost, the model unloaded, ...: said, not raised
                err = (
                    to_service_error(failure)
                    if isinstance(failure, Exception)
                    else ServiceError("the work was stopped")
                )
                yield sse("error", problem_body(err, path))
                return
            reply = entry.future.result()
            if reply.error is not None:
                yield sse("error", problem_body(ServiceError.from_data(reply.error), path))
                return
            wait_ms = max(0.0, (time.perf_counter() - submitted) * 1e3 - reply.compute_ms)
            yield sse("result", answer(reply, wait_ms))
        finally:  # the client went, or the server stops: the work stops too
            if not entry.future.done():
                pool.cancel(entry)

    return body()
