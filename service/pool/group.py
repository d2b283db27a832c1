"""One worker group: its workers, its bounded queue, adaptive batching, dispatch, supervision.

A group serves a set of models (``service.pool.pool`` routes each model to its group); what
happens to a group (a model that cannot load, a crash, a stuck request) touches no other.
Its processes (spawn, channel, heartbeats, kill, restart) are ``service.pool.processes``; what
work costs, and so the queue's order and the split of expensive requests, ``service.pool.costs``.

Dispatch is adaptive: an idle worker gets a request at once; while a worker is computing,
requests that may share an engine call (same merge key) wait together and go as one batch, up
to the cost cap, when it is idle again. A sealed batch (full, or of requests that never merge,
as with batching off) may also wait in a worker's ready slot behind the one computing, so the
worker need not wait for the parent between batches; a batch that can still grow does not,
since everything arriving during the computation would otherwise form yet another small batch.
``batch_window_ms`` > 0 holds a new batch open that long for companions, even for an idle worker.

Cancellation: ``cancel(entry)`` frees the request's queue slot at once; if its batch is already
with a worker, the worker is told, and stops the engine at its next checkpoint once every
request in the batch is cancelled (a merged batch finishes for the others).

A worker killed (silent, or stuck on cancelled work): its requests get 503 with Retry-After,
and the group's other requests wait for the new worker. A worker process that exits by itself
(a crash) leaves its models "failed" until a worker is ready again: their requests get 503 at
once, naming the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from model_registry.spec import ModelSpec
from service.core.errors import ModelUnavailable, NotReady, QueueFull, ServiceError, WorkerLost
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.core.work import Batch, Reply, Work
from service.pool import split
from service.pool.cores import Cores
from service.pool.costs import Costs
from service.pool.predictors import Predictors
from service.pool.processes import Processes
from service.pool.records import DEPTH, PREEMPTED, Entry, Pending, Worker
from service.pool.share import WorkerTime
from service.worker import threads
from service.worker.messages import (
    Cancel,
    Event,
    FromWorker,
    Heartbeat,
    Ready,
    Replied,
    StartFailed,
)

log = logging.getLogger("attrserve.pool")
__all__ = ["PREEMPTED", "Entry", "Group"]
#: what a model's state may be (``Group.model_state``)
LOADING, READY, FAILED = "loading", "ready", "failed"


class Group(Processes):
    """``workers``: the indices of its worker processes (unique across groups: logs, GPUs);
    ``cores``: the cores shared with the other groups (default: this group's alone)."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        specs: list[ModelSpec],
        telemetry: Telemetry,
        workers: range,
        cores: Cores | None = None,
    ) -> None:
        if cores is None:
            cores = Cores(threads.cpu_count(), settings.torch_threads, lambda: self.workers)
        super().__init__(name, settings, specs, workers, cores)
        self.telemetry = telemetry
        self.model_info: dict[str, dict[str, Any]] = {}
        #: models a worker could not load, with the reason (its last report)
        self.load_errors: dict[str, str] = {}
        self._reported: dict[str, str] = {}  # the load errors last logged
        #: why the group has no worker after one exited by itself (None: it has, or none did)
        self.crash: str | None = None
        self.costs = Costs(settings)
        self.predictors = Predictors(specs)  # remote models: how their predictor answers
        self._ids = itertools.count(1)
        self._waiting: deque[Pending] = deque()
        self._by_key: dict[tuple[Any, ...], Pending] = {}
        self._draining = False
        #: job chunks waiting (``Work.background``), and recent worker time by kind (decaying)
        self._jobs: deque[Pending] = deque()
        self.worker_time = WorkerTime(settings.job_share)

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self._start_processes()

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish for up to ``timeout`` seconds,
        then answer what is left with 503."""
        self._draining = True
        end = time.monotonic() + timeout
        while self._open_entries() and time.monotonic() < end:
            await asyncio.sleep(0.05)
        self._fail_all(NotReady("the server is shutting down", headers=self._retry()))

    async def retire(self, timeout: float) -> None:
        """A group replaced or unloaded: let the work it holds finish (for up to ``timeout``
        seconds), then stop it."""
        end = time.monotonic() + timeout
        while (self._open_entries() or self._jobs) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        await self.stop()

    async def stop(self) -> None:
        """Stop the workers (politely, then by force) and fail whatever is still open."""
        self._draining = True
        await self._stop_processes()
        self._fail_all(NotReady("the server is shutting down", headers=self._retry()))

    def _fail_all(self, err: ServiceError) -> None:
        pendings = [*self._waiting, *self._jobs, *(p for w in self.workers for p in w.outstanding)]
        for p in pendings:
            for e in p.entries:
                if not e.future.done():
                    e.future.set_exception(err)
        self._waiting.clear()
        self._jobs.clear()
        self._by_key.clear()

    def _open_entries(self) -> int:
        pendings = [*self._waiting, *(p for w in self.workers for p in w.outstanding)]
        return sum(1 for p in pendings for e in p.entries if not e.future.done())

    def _retry(self, wait_ms: float = 0.0) -> dict[str, str]:
        """Retry-After: ``wait_ms`` rounded up to seconds, at least ``retry_after_s``."""
        return {"Retry-After": str(max(self.settings.retry_after_s, math.ceil(wait_ms / 1e3)))}

    # -- status ----------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def live(self) -> list[Worker]:
        """Workers that have loaded their models and take work."""
        return [w for w in self.workers if w.state in ("ready", "busy")]

    def model_state(self, model_id: str) -> tuple[str, str | None]:
        """``(state, reason)``: "ready" once a worker serves the model; "failed" when it could
        not load or was refused by its checks (the reason: the error), or while the group has
        no worker after a crash; else "loading" (starting, or a worker being replaced)."""
        if model_id in self.load_errors:
            return FAILED, self.load_errors[model_id]
        refused = self.unready_models().get(model_id)
        if refused is not None:
            return FAILED, refused
        if self.live:
            return READY, None
        if self.crash is not None:
            return FAILED, self.crash
        restarted = [w.reason for w in self.workers if w.reason and w.state != "failed"]
        return LOADING, (f"its worker is being replaced ({restarted[0]})" if restarted else None)

    def unready_models(self) -> dict[str, str]:
        """Models a worker refused to serve (a failed device check), with the reason."""
        out: dict[str, str] = {}
        for w in self.live:
            for mid, info in w.models.items():
                reason = info.get("not_ready")
                if reason and mid not in out:
                    out[mid] = reason if len(self.workers) == 1 else f"worker {w.index}: {reason}"
        return out

    def _queued(self) -> Iterator[Pending]:
        """Synchronous batches not yet computing: in the parent's queue or ready behind a
        worker's batch."""
        yield from self._waiting
        for w in self.workers:
            yield from itertools.islice(w.outstanding, 1, None)

    def queue_depth(self) -> int:
        """Requests not yet computing (a split request, any of whose pieces waits, once)."""
        return len({id(e.whole or e) for p in self._queued() for e in p.entries})

    def backlog_ms(self) -> float:
        """The estimated compute queued, per worker taking work (as the rates known say)."""
        total = sum(self.costs.estimate(p) for p in self._queued())
        return total / max(1, len(self.live))

    def _admit(self, work: Work) -> None:
        """Admission bounds the requests waiting (``queue_size``), and for a request costing
        more than one piece the compute queued before it (``max_backlog_s``, or its own
        deadline where that is longer; an idle server admits any). 429's Retry-After: when
        the backlog will have drained to the limit."""
        backlog = self.backlog_ms()
        if self.queue_depth() >= self.settings.queue_size:
            self.telemetry.rejected.inc()
            raise QueueFull(
                f"{self.settings.queue_size} requests are already waiting; retry shortly",
                headers=self._retry(backlog),
            )
        limit, rate = self.settings.max_backlog_s * 1e3, self.costs.rate(work)
        own = work.cost * rate if rate is not None else 0.0
        if limit and work.deadline:
            limit = max(limit, (work.deadline - time.time()) * 1e3 - own)
        beyond_piece = own > self.settings.split_ms > 0
        if limit and beyond_piece and backlog > limit:
            self.telemetry.rejected.inc()
            raise QueueFull(
                f"this request (about {own / 1e3:.1f} s of compute) would wait behind "
                f"{backlog / 1e3:.1f} s of queued work, over this server's backlog limit of "
                f"{limit / 1e3:.3g} s; retry later, or submit it as a job (POST "
                f"/v1/models/{work.model_id}/attribution-jobs)",
                headers=self._retry(backlog - limit),
            )

    def status(self) -> list[dict[str, Any]]:
        keys = ("index", "pid", "state", "restarts")  # and the group, the last restart reason
        return [
            {"group": self.name, "last_restart_reason": w.reason} | {k: getattr(w, k) for k in keys}
            for w in self.workers
        ]

    # -- submission ------------------------------------------------------------------------
    def submit(self, work: Work) -> Entry:
        if not self.workers:
            raise NotReady("this server runs no workers")
        if self._draining:
            raise NotReady("the server is shutting down", headers=self._retry())
        state, reason = self.model_state(work.model_id)
        if state == FAILED:
            raise ModelUnavailable.of(work.model_id, reason, headers=self._retry())
        if work.background:
            entry = Entry(work, self._running_loop().create_future())
            entry.pending = Pending(next(self._ids), [entry], work.cost, None, background=True)
            self._jobs.append(entry.pending)
            self._dispatch()
            return entry
        self._admit(work)
        rows = self.costs.piece_rows(work)
        if rows is not None:
            return split.split_entry(work, rows, self._running_loop(), self._piece, self.cancel)
        self._dispatch_one(entry := Entry(work, self._running_loop().create_future()))
        return entry

    def _piece(self, part: Entry) -> None:
        """A piece of a split request: queued alone (never merged, to an idle worker only)."""
        part.group = self
        self._dispatch_one(part, piece=True)

    def _dispatch_one(self, entry: Entry, *, piece: bool = False) -> None:
        work = entry.work
        key = work.key if self.settings.batching and not piece else None
        pending = self._by_key.get(key) if key is not None else None
        if pending is not None and self.costs.fits(pending.cost + work.cost, work):
            pending.entries.append(entry)
            pending.cost += work.cost
        else:
            pending = Pending(next(self._ids), [entry], work.cost, key, closed=True, piece=piece)
            self._waiting.append(pending)
            if key is not None:
                self._by_key[key] = pending
                window = self.settings.batch_window_ms / 1e3
                if window > 0:
                    pending.closed = False
                    self._running_loop().call_later(window, self._close_window, pending)
        entry.pending = pending
        if pending.key is not None and not self.costs.fits(pending.cost + 1, work):
            self._by_key.pop(pending.key, None)
            pending.closed = True
        self._dispatch()
        self._preempt()

    def cancel(self, entry: Entry) -> None:
        """Give up on a request: its queue slot is free at once, its work stops soon."""
        if not entry.future.done():
            entry.future.cancel()
        for part in entry.parts:
            self.cancel(part)
        pending = entry.pending
        if pending is None or entry not in pending.entries:
            return
        pending.entries.remove(entry)
        pending.cost -= entry.work.cost
        w = pending.worker
        if w is None:  # still queued here
            if not pending.entries:
                self._forget(pending)
        else:
            if not pending.entries:
                pending.abandoned_at = time.monotonic()
            self._write(w, Cancel((entry.work.id,)))
        self.telemetry.queue_depth.set(self.queue_depth())

    def _close_window(self, pending: Pending) -> None:
        pending.closed = True
        self._dispatch()

    def _next(self) -> Pending | None:
        return self.costs.next(self._waiting)

    def _growable(self, pending: Pending) -> bool:
        """Whether requests arriving now could still join this batch."""
        return pending.key is not None and self._by_key.get(pending.key) is pending

    # -- jobs beside synchronous requests ---------------------------------------------------
    def _dispatch_jobs(self, waiting_sync: bool) -> None:
        """Work chunks to idle workers: when no synchronous request waits, or when owed."""
        while self._jobs and (not waiting_sync or self.worker_time.owed()):
            idle = [w for w in self.workers if w.state == "ready" and not w.outstanding]
            if not idle:
                return
            pending = self._jobs.popleft()
            pending.entries = [e for e in pending.entries if not e.future.done()]
            if pending.entries:
                pending.preempted = False
                self._send(idle[0], pending)

    def _preempt(self) -> None:
        """Synchronous requests wait (queued, or in the ready slot behind a job chunk): stop
        the job chunks running (unless jobs are owed their share); their runner gets
        ``PREEMPTED`` and tries again with a smaller chunk, which fits the idle moments
        better."""
        if self.worker_time.owed():
            return
        queued = self._next() is not None
        for w in self.workers:
            running = w.outstanding[0] if w.outstanding else None
            if running is None or not running.background or running.preempted:
                continue
            if queued or len(w.outstanding) > 1:  # a synchronous batch waits behind it
                running.preempted = True
                self._write(w, Cancel(tuple(e.work.id for e in running.entries)))

    def _dispatch(self) -> None:
        if self._jobs and self.worker_time.owed():
            self._dispatch_jobs(waiting_sync=True)
        while self._waiting:
            pending = self._next()
            if pending is None:
                break
            # A batch that may still grow goes only to an idle worker: what arrives while the
            # worker computes joins it, and bigger batches cost less CPU per request. A sealed
            # batch (full, or never merged) may wait in a worker's ready slot.
            # Work of more than a piece (a piece of a split request included) goes only to an
            # idle worker too: a cheap request arriving meanwhile then waits for one piece.
            big = self.costs.beyond_piece(pending)
            depth = 1 if self._growable(pending) or big else DEPTH
            free = [w for w in self.live if len(w.outstanding) < depth]
            if not free:
                break
            self._forget(pending)
            pending.entries = [e for e in pending.entries if not e.future.done()]
            if pending.entries:
                self._send(min(free, key=lambda w: len(w.outstanding)), pending)
        self._dispatch_jobs(waiting_sync=self._next() is not None)
        self.telemetry.queue_depth.set(self.queue_depth())

    def _send(self, w: Worker, pending: Pending) -> None:
        now = time.perf_counter()
        for e in pending.entries:
            e.dispatched = now
        w.state = "busy"
        pending.worker = w
        pending.timed = self.costs.timed(pending)
        pending.threads = self.cores.grant(w, many=self.costs.parallel(pending))
        w.outstanding.append(pending)
        self.telemetry.batch_size.observe(len(pending.entries))
        if len(pending.entries) > 1:
            self.telemetry.merged.inc(len(pending.entries))
        works = [e.work for e in pending.entries]
        self._write(w, Batch(pending.id, works, pending.threads))

    def _report_load_errors(self) -> None:
        """One log line per model that did not load, and again only if the reason changes
        (a worker restarted with backoff meets the same mistake each time)."""
        for mid, why in self.load_errors.items():
            if self._reported.get(mid) != why:
                log.error("attrserve: model %r (group %r) failed to load: %s", mid, self.name, why)
        self._reported = dict(self.load_errors)

    # -- worker messages -------------------------------------------------------------------
    def _on_message(self, w: Worker, generation: int, msg: FromWorker) -> None:
        if generation != w.generation:
            return
        w.last_heard = time.monotonic()
        match msg:
            case Heartbeat():
                return
            case Event(work_id, payload):  # to its waiter; nothing to dispatch
                entry = w.sent(work_id)
                if entry is not None:
                    entry.event(payload)
                return
            case Ready():
                w.state, w.pid, w.failures = "ready", msg.pid, 0
                w.models = msg.models
                self.model_info = w.models
                self.load_errors = dict(msg.failed)
                self._report_load_errors()
                self.crash = None
                models = ", ".join(f"{m} ({i['device']})" for m, i in self.model_info.items())
                log.info("attrserve: worker %d (pid %s) serves %s", w.index, w.pid, models)
                self._fail_waiting()
            case StartFailed(error, failed):
                w.state = "failed"
                w.failures += 1
                w.reason = "it failed to load the models"
                self.load_errors = {s.id: failed.get(s.id, error) for s in self.specs}
                self._report_load_errors()
                self._fail_waiting()
            case Replied(_, replies):
                pending = w.outstanding.popleft() if w.outstanding else None
                if not w.outstanding:
                    w.state = "ready"
                if pending is not None:
                    self._done(pending, replies)
        self._dispatch()

    def _done(self, pending: Pending, replies: list[Reply]) -> None:
        started = min((e.dispatched for e in pending.entries), default=time.perf_counter())
        self.worker_time.account(pending.background, time.perf_counter() - started)
        self.costs.learn(pending, replies)
        by_id = {e.work.id: e for e in pending.entries}
        for reply in replies:
            entry = by_id.get(reply.work_id)
            if entry is None or entry.future.done():
                continue
            cancelled = reply.error is not None and reply.error.get("code") == "cancelled"
            if pending.preempted and cancelled:  # stopped for synchronous work: the job's
                reply = Reply(work_id=reply.work_id, error=PREEMPTED)  # runner tries a smaller one
            self.predictors.note(entry.work.model_id, reply)
            entry.future.set_result(reply)

    def _fail_waiting(self) -> None:
        """Answer the queued requests of models now "failed" at once (503 naming the model)."""
        for pending in list(self._waiting):
            for e in list(pending.entries):
                state, reason = self.model_state(e.work.model_id)
                if state == FAILED:
                    if not e.future.done():
                        e.future.set_exception(
                            ModelUnavailable.of(e.work.model_id, reason, headers=self._retry())
                        )
                    pending.entries.remove(e)
                    pending.cost -= e.work.cost
            if not pending.entries:
                self._forget(pending)

    def _forget(self, pending: Pending) -> None:
        """An empty batch out of the queue (and no longer open to companions)."""
        with contextlib.suppress(ValueError):
            (self._jobs if pending.background else self._waiting).remove(pending)
        if pending.key is not None and self._by_key.get(pending.key) is pending:
            del self._by_key[pending.key]

    def _on_dead(self, w: Worker, generation: int, reason: str, *, crashed: bool = False) -> None:
        """``crashed``: the process exited by itself (else: killed, stuck or silent)."""
        if generation != w.generation:
            return
        self._close(w)
        if w.outstanding:
            for e in w.outstanding.popleft().entries:
                if not e.future.done():
                    e.future.set_exception(
                        WorkerLost(
                            f"the worker serving model {e.work.model_id!r} was lost ({reason}); "
                            "it is being restarted",
                            headers=self._retry(),
                        )
                    )
            # batches that never started wait for a worker again, at the head of the queue
            for p in reversed(w.outstanding):
                p.worker = None
                (self._jobs if p.background else self._waiting).appendleft(p)
            w.outstanding.clear()
        if w.state != "failed":
            w.state, w.reason = "dead", reason
            if crashed and not self.live and not self._stopping:
                self.crash = f"its worker crashed ({reason}); it is being restarted"
                log.error("attrserve: group %r: %s", self.name, self.crash)
                self._fail_waiting()
        w.generation += 1
        if self._restart(w):
            self.telemetry.restarts.inc()
            self._dispatch()
