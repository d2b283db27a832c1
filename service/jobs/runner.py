"""Attribution jobs: validated and decoded whole at submission and stored decoded
(``service.jobs.stored``), then run chunk by chunk through the worker pool as background work
(``Work.background``: synchronous requests keep priority, jobs get
``job_share`` of worker time while those wait), persisted after every chunk.

One job runs at a time, oldest first. A server restart (clean or killed) requeues the job that
was running; it resumes after its last finished chunk. Finished jobs are removed after
``job_ttl_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from model_registry.spec import ModelSpec
from service.core.errors import (
    InvalidRequest,
    JobUnreadable,
    NotReady,
    QueueFull,
    ServiceError,
    StorageFull,
    WorkerLost,
)
from service.core.offload import offload
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.core.work import Reply, Work, new_id
from service.jobs.results import chunk_arrays, joined_reply, merged
from service.jobs.store import JobRow, JobStore
from service.jobs.stored import dumps, fingerprint, loads
from service.pool.pool import PREEMPTED, Entry, WorkerPool
from service.pool.predictors import UPSTREAM_CODES
from service.pool.split import chunk
from service.serving import capability
from service.serving.capability import Capability

log = logging.getLogger("attrserve.jobs")
#: jobs stored before they named their operation: the operation their work's label implies
LEGACY = {
    "attack": "attacks",
    "counterfactual": "counterfactuals",
    "influence_index": "influence-index",
}
#: times a chunk is tried again after its worker was lost
RETRIES = 3
#: how long a chunk waits for its model's worker group to be ready before the job fails
UNAVAILABLE_S = 60.0
#: finished chunks are written together at most this often, or once this many bytes wait
WRITE_EVERY_S = 1.0
WRITE_BYTES = 8 << 20
#: examples in a job's first chunk when its model and method's cost is not known yet; each
#: next chunk is sized from the last one's time, growing at most GROWTH times (a small first
#: chunk's time is mostly fixed costs: it overestimates the cost per example, never under)
FIRST_CHUNK = 4
GROWTH = 16
#: the fewest examples a last chunk is left with (fewer join the chunk before)
TAIL = 3
#: the longest wait before a job tries the full disk again
MAX_BACKOFF_S = 30.0
#: a remote model's predictor that fails (502/504) is the predictor's trouble, often passing
#: (a restart, a rollout): the chunk is tried again, waiting 1, 2, 4 ... 15 s, for this long
#: after its first failure before the job fails
UPSTREAM_PATIENCE_S = 300.0


def job_settings(settings: Settings) -> Settings:
    """The limits a whole job is validated against: its size is bounded by the job body and
    example limits, not by the synchronous per-request ones (each chunk still meets those)."""
    return settings.model_copy(
        update={
            "max_batch_size": settings.max_job_examples,
            "max_tensor_elements": max(settings.max_tensor_elements, settings.max_job_body_bytes),
            "max_cost": 2**62,
        }
    )


class JobRunner:
    def __init__(
        self,
        settings: Settings,
        specs: dict[str, ModelSpec],
        pool: WorkerPool,
        telemetry: Telemetry,
        capabilities: Mapping[str, Capability[Any]] = MappingProxyType({}),
    ) -> None:
        """``capabilities``: by operation, what answers each job's result."""
        self.capabilities = capabilities
        self.settings = settings
        self.specs = specs
        self.pool = pool
        self.telemetry = telemetry
        self.store = JobStore(settings.data_dir)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        #: the chunk running now: (job id, its pool entry)
        self._current: tuple[str, Entry] | None = None
        #: jobs cancelled while the disk was full: cancelled now, written when there is room
        self._cancelling: set[str] = set()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        n = self.store.requeue_interrupted()
        if n:
            log.info("attrserve: %d interrupted job(s) queued again", n)
        self._tasks = [
            asyncio.create_task(self._loop()),
            asyncio.create_task(self._expire()),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        self.store.close()

    # -- the API ---------------------------------------------------------------------------
    async def submit_work(
        self,
        owner: str,
        spec: ModelSpec,
        build: Callable[[Settings], Work],
        size: int,
        *,
        operation: str = "attributions",
        options: Callable[[Work], dict[str, Any]] | None = None,
    ) -> JobRow:
        """A capability's request as a job (``Capability.submit``): the queue's room and the
        disk budget checked, the work built and checked whole now by ``build`` under the job
        limits (``job_settings``; a bad request gets its 4xx here), off the event loop, then
        stored decoded and queued; ``size``: the request body's bytes (the disk budget's first
        check); ``operation``: the route it answers as, ``options``: what its answer needs of
        the request beyond the work."""
        self._admit()
        self._budget(size)
        checked = await offload(build, job_settings(self.settings))
        kept = options(checked) if options is not None else None
        return await self._queue(owner, spec, checked, operation, kept)

    def _admit(self) -> None:
        """The queue has room."""
        counts = self.store.counts()
        if counts["queued"] + counts["running"] >= self.settings.max_jobs_queued:
            raise QueueFull(
                f"{self.settings.max_jobs_queued} jobs are already queued or running; retry "
                "when one has finished",
                headers={"Retry-After": "30"},
            )

    async def _queue(
        self,
        owner: str,
        spec: ModelSpec,
        checked: Work,
        operation: str,
        options: dict[str, Any] | None,
    ) -> JobRow:
        """A checked job stored and queued, in chunks of about ``job_chunk_cost`` rows (work
        whose examples are not independent, ``Work.divisible`` False, in one)."""
        per_example = max(1, checked.cost // max(1, checked.n))
        chunk = max(1, self.settings.job_chunk_cost // per_example)
        if not checked.divisible:
            chunk = checked.n
        if checked.divisible and per_example > self.settings.max_cost:
            raise InvalidRequest(
                f"one example costs about {per_example} forward rows; the server's limit per "
                f"chunk is {self.settings.max_cost}",
                loc=("body",),
            )
        work = await offload(dumps, checked, fingerprint(spec))
        self._budget(len(work))  # decoded, the job may take more than its body did
        row = self.store.create(
            owner, spec.id, checked.name, checked.n, chunk, work, operation, options
        )
        self._wake.set()
        self._gauges()
        return row

    def queue_work(
        self, owner: str, spec: ModelSpec, job: Work, chunk: int, operation: str
    ) -> JobRow:
        """Queue work the server made itself (an influence index build): ``job`` checked
        already, run in chunks of at most ``chunk`` examples, answered as ``operation``."""
        work = dumps(job, fingerprint(spec))
        self._budget(len(work))
        row = self.store.create(owner, spec.id, job.name, job.n, chunk, work, operation)
        self._wake.set()
        self._gauges()
        return row

    def _budget(self, size: int) -> None:
        if self.store.used_bytes() + size > self.settings.max_data_bytes:
            raise StorageFull(
                f"the jobs' disk budget ({self.settings.max_data_bytes} bytes) is full; "
                "fetch and delete finished jobs, or retry when older ones expire"
            )

    def get(self, owner: str, job_id: str) -> JobRow | None:
        row = self.store.get(job_id)
        return self.shown(row) if row is not None and row.owner == owner else None

    def cancel(self, row: JobRow) -> JobRow:
        """Cancel a queued or running job; the running chunk stops at its next checkpoint. On
        a full disk the cancellation holds at once and is written once there is room."""
        try:
            finished = self.store.finish(row.id, "cancelled")
        except StorageFull:
            finished = row.status in ("queued", "running")
            if finished:
                self._cancelling.add(row.id)
        if finished and self._current is not None:
            job_id, entry = self._current
            if job_id == row.id:
                capability.cancel(self.pool, entry)
        self._gauges()
        return self.shown(self.store.get(row.id) or row)

    def delete(self, row: JobRow) -> None:
        """A finished job and its result, gone (a cancelled job's last chunk, if it still
        computes, is stopped: nothing is written after)."""
        if self._current is not None and self._current[0] == row.id:
            capability.cancel(self.pool, self._current[1])
        self._cancelling.discard(row.id)
        self.store.delete(row.id)
        self._gauges()

    def shown(self, row: JobRow) -> JobRow:
        """``row`` as the API shows it: cancelled if a cancellation waits to be written."""
        if row.id in self._cancelling and row.status in ("queued", "running"):
            return dataclasses.replace(row, status="cancelled")
        return row

    # -- running ---------------------------------------------------------------------------
    async def _loop(self) -> None:
        backoff = 1.0
        while True:
            row = self.store.next_queued()
            if row is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if row.id in self._cancelling:  # write the cancellation, run nothing
                    self.store.finish(row.id, "cancelled")
                    self._cancelling.discard(row.id)
                else:
                    await self._run(row)
                backoff = 1.0
            except asyncio.CancelledError:
                raise
            except StorageFull:  # the job keeps its status and resumes after its last write
                log.warning(
                    "attrserve: job %s waits %.0f s: the jobs' disk is full", row.id, backoff
                )
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
            except Exception as exc:  # a bug: the job fails, the loop goes on
                log.exception("attrserve: job %s failed", row.id)
                with contextlib.suppress(StorageFull):  # else it runs again, as interrupted
                    self.store.finish(row.id, "failed", _error(exc))
            self._gauges()

    async def _run(self, row: JobRow) -> None:
        if not self.store.start(row.id):
            return
        self._gauges()
        try:
            whole, model = await asyncio.to_thread(loads, self.store.work(row.id))
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a file of another version
            raise JobUnreadable(
                f"the job's stored work cannot be read ({type(exc).__name__}); submit it again"
            ) from None
        spec = self.specs.get(row.model_id)
        if spec is None or model != fingerprint(spec):
            raise JobUnreadable(
                f"model {row.model_id!r} is no longer served as it was when the job was "
                "submitted (its version, kind or inputs changed); submit the job again"
            )
        target_s = self.settings.job_chunk_ms / 1e3
        done, size = row.done, self._first_size(row, whole, target_s)
        # finished chunks wait in memory and go to disk together (one file, then the progress
        # that counts it): fewer, larger files; a crash recomputes only what was not written
        unwritten: list[dict[str, np.ndarray]] = []
        held, written, last_write = 0, done, time.monotonic()
        flapping: float | None = None  # when the predictor's current run of failures began
        wait_s = 1.0
        while done < row.total:
            stop = min(row.total, done + size)
            if 0 < row.total - stop < TAIL:
                # no tail of one or two examples: it rounds otherwise than the request whole
                # (MKL's matrix-vector path: CONTRACT 9.1); it joins this chunk
                stop = row.total
            started = time.perf_counter()
            ran = await self._chunk(row, chunk(whole, done, stop))
            if ran is None:  # cancelled
                return
            reply, _ = ran
            if reply.error is not None and reply.error.get("code") == PREEMPTED["code"]:
                size = max(1, (stop - done) // 2)  # stopped for synchronous work: smaller
                continue
            code = None if reply.error is None else reply.error.get("code")
            if code in UPSTREAM_CODES:
                flapping = time.monotonic() if flapping is None else flapping
                if time.monotonic() - flapping < UPSTREAM_PATIENCE_S:
                    why = (reply.error or {}).get("detail", code)
                    log.warning("job %s: %s; the chunk again in %.0f s", row.id, why, wait_s)
                    await asyncio.sleep(wait_s)
                    wait_s = min(15.0, 2 * wait_s)
                    continue
            if reply.error is not None:
                self.store.finish(row.id, "failed", _error(ServiceError.from_data(reply.error)))
                return
            flapping, wait_s = None, 1.0
            unwritten.append(chunk_arrays(reply))
            held += sum(a.nbytes for a in unwritten[-1].values())
            # the next chunk sized to take about job_chunk_ms: short chunks keep synchronous
            # requests waiting little when a chunk runs while they wait (jobs owed their share)
            per_example = max(reply.compute_ms / 1e3, time.perf_counter() - started) / (stop - done)
            size = _examples_in(target_s, per_example, min(GROWTH * size, row.chunk))
            done = stop
            due = time.monotonic() - last_write >= WRITE_EVERY_S or held >= WRITE_BYTES
            if due or done == row.total:
                arrays = merged(unwritten)
                nbytes = await asyncio.to_thread(self.store.write_chunk, row.id, written, arrays)
                self.store.progress(row.id, done, nbytes)
                unwritten, held, written, last_write = [], 0, done, time.monotonic()
        self.store.finish(row.id, "succeeded")

    def _first_size(self, row: JobRow, whole: Work, target_s: float) -> int:
        """Examples in the first chunk: ``job_chunk_ms`` worth at the model and method's
        measured rate (synchronous requests and earlier jobs teach it), else ``FIRST_CHUNK``.

        Few, large chunks matter for cheap models: 2,000 tabular IG rows in chunks of 40 cost
        3x the engine's CPU of one call (each chunk pays the engine's per-pass work again)."""
        rate = self.pool.rate(whole)
        if not rate:
            return min(row.chunk, FIRST_CHUNK)
        return _examples_in(target_s, rate * whole.cost / max(1, whole.n) / 1e3, row.chunk)

    async def _chunk(self, row: JobRow, part: Work) -> tuple[Reply, Work] | None:
        """One chunk through the pool, as background work; None when the job was cancelled.

        A model not ready (its worker group starting or restarting after a crash) is waited
        for up to ``UNAVAILABLE_S``; then the job fails with the reason."""
        waited_until = time.monotonic() + UNAVAILABLE_S
        attempt = 0
        while attempt <= RETRIES:
            job = dataclasses.replace(
                part,
                id=new_id(),
                deadline=time.time() + self.settings.max_deadline_ms / 1e3,
                request_id=f"job-{row.id}",
                background=True,
            )
            started = time.perf_counter()
            try:
                entry = capability.queue(self.pool, job)
            except NotReady:
                if time.monotonic() > waited_until and not self.pool.draining:
                    raise
                await asyncio.sleep(1.0)
                continue
            attempt += 1
            self._current = (row.id, entry)
            try:
                reply = await entry.future
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # the server is stopping
                    raise
                return None  # pool.cancel: the job was cancelled
            except (WorkerLost, NotReady):
                if attempt > RETRIES:
                    raise
                continue
            finally:
                self._current = None
            self.telemetry.job_chunk.observe(time.perf_counter() - started)
            current = self.store.get(row.id)
            if current is None or current.status == "cancelled" or row.id in self._cancelling:
                return None
            return reply, job
        raise WorkerLost("the job's chunk could not be run")

    async def _expire(self) -> None:
        every = min(60.0, self.settings.job_ttl_s / 4)
        while True:
            for job_id in self.store.expired(self.settings.job_ttl_s):
                await asyncio.to_thread(self.store.delete, job_id)
            self._gauges()
            await asyncio.sleep(every)

    def _gauges(self) -> None:
        counts = self.store.counts()
        for status, n in counts.items():
            self.telemetry.jobs.labels(status).set(n)
        self.telemetry.job_queue.set(counts["queued"])

    # -- results ---------------------------------------------------------------------------
    def result(self, row: JobRow) -> dict[str, Any]:
        """The whole job as its route answers (``Capability.result``: the route's own answer
        of the chunks joined into one reply), with its ``job_id``."""
        operation = row.operation or LEGACY.get(row.method, "attributions")
        capability = self.capabilities.get(operation)
        spec = self.specs.get(row.model_id)
        if capability is None or spec is None:
            raise JobUnreadable(
                f"the job's {operation} result cannot be answered: model {row.model_id!r} or "
                "its operation is no longer served"
            )
        work, _ = loads(self.store.work(row.id))
        chunks = self.store.read_chunks(row.id) if capability.chunked_result else []
        whole = joined_reply(chunks)
        started = row.started_at if row.started_at is not None else row.created_at
        finished = row.finished_at if row.finished_at is not None else started
        timing_ms = {  # queued until its first chunk ran; in all until its last was written
            "queue": round((started - row.created_at) * 1e3, 3),
            "compute": round(whole.compute_ms, 3),
            "total": round((finished - row.created_at) * 1e3, 3),
        }
        options = row.options if row.options is not None else capability.legacy_options(work)
        body = capability.result(spec, work, whole, options, timing_ms)
        return {"job_id": row.id, **body}


def _examples_in(target_s: float, per_example_s: float, cap: int) -> int:
    """Examples that take about ``target_s`` at ``per_example_s`` each: 1 to ``cap``."""
    return max(1, min(int(target_s / max(per_example_s, 1e-6)), cap))


def _error(exc: Exception) -> dict[str, Any]:
    err = exc if isinstance(exc, ServiceError) else ServiceError("internal error")
    return {"status": err.status, "title": err.title, "detail": err.detail, "errors": err.errors}
