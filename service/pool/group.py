"""One worker group: its workers, its bounded queue, adaptive batching, dispatch, supervision.

A group serves a set of models (``service.pool.pool`` routes each model to its group); what
happens to a group (a model that cannot load, a crash, a stuck request) touches no other.
Each worker is a spawned process with one socket-pair channel (``service.worker.channel``) that
the event loop reads and writes through asyncio streams: the loop never blocks on a worker.
Dispatch is adaptive: an idle worker gets a request at once; while a worker is computing,
requests that may share an engine call (same merge key) wait together and go as one batch, up
to the cost cap, when it is idle again. A sealed batch (full, or of requests that never merge,
as with batching off) may also wait in a worker's ready slot behind the one computing, so the
worker need not wait for the parent between batches; a batch that can still grow does not,
since everything arriving during the computation would otherwise form yet another small batch.
``batch_window_ms`` > 0 also holds a new batch open that long for companions even when a worker
is idle.

Cancellation: ``cancel(entry)`` frees the request's queue slot at once; if its batch is already
with a worker, the worker is told, and stops the engine at its next checkpoint once every
request in the batch is cancelled (a merged batch finishes for the others).

Supervision: workers send heartbeats. One silent for ``worker_timeout_s`` (stopped, hung in C
code, swapped out), or still busy ``worker_timeout_s`` after its whole batch was cancelled, is
killed and restarted; its requests get 503 with Retry-After, and the group's other requests
wait for the new worker. A worker process that exits by itself (a crash) leaves its models
"failed" until a worker is ready again: their requests get 503 at once, naming the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import socket
import time
from collections import deque
from typing import Any

from model_registry.spec import ModelSpec
from service.core.errors import ModelUnavailable, NotReady, QueueFull, ServiceError, WorkerLost
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.core.work import Batch, Job, Reply
from service.pool import split
from service.pool.records import DEPTH, PREEMPTED, STARTUP_GRACE_S, Entry, Pending, Worker
from service.worker.channel import frame, read_message
from service.worker.main import worker_main

log = logging.getLogger("attrserve.pool")
__all__ = ["PREEMPTED", "Entry", "Group"]
#: what a model's state may be (``Group.model_state``)
LOADING, READY, FAILED = "loading", "ready", "failed"
#: how much waiting counts against a batch's estimated compute in the queue's order: a 100 ms
#: piece goes before fresh 1 ms work once it has waited about 10 s (nothing starves)
AGING = 0.01


class Group:
    """``workers``: the indices of its worker processes (unique across groups: logs, GPUs);
    ``threads``: torch threads of each."""

    def __init__(
        self,
        name: str,
        settings: Settings,
        specs: list[ModelSpec],
        telemetry: Telemetry,
        workers: range,
        threads: int = 1,
    ) -> None:
        self.name = name
        self.settings = settings
        self.specs = specs
        self.telemetry = telemetry
        self.threads = threads
        self.workers = [Worker(i) for i in workers]
        self.model_info: dict[str, dict[str, Any]] = {}
        #: models a worker could not load, with the reason (its last report)
        self.load_errors: dict[str, str] = {}
        #: why the group has no worker after one exited by itself (None: it has, or none did)
        self.crash: str | None = None
        #: compute per unit of cost (ms per forward row) by model and method: orders and
        #: splits work
        self._rate: dict[tuple[str, str], float] = {}
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._waiting: deque[Pending] = deque()
        self._by_key: dict[tuple[Any, ...], Pending] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._draining = False
        self._gpus = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        #: job chunks waiting (``Job.background``), and recent worker time by kind (decaying)
        self._jobs: deque[Pending] = deque()
        self._busy = {False: 0.0, True: 0.0}
        self._busy_at = time.monotonic()

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        import torch

        self._gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.workers:
            self._background(self._supervise())
        for w in self.workers:
            await self._spawn(w)

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
        self._stopping = self._draining = True
        for task in list(self._tasks):
            task.cancel()
        for w in self.workers:
            if w.writer is not None:
                with contextlib.suppress(Exception):
                    w.writer.write(frame(None))
        deadline = time.monotonic() + 5
        for w in self.workers:
            if w.process is not None:
                await asyncio.to_thread(w.process.join, max(0.0, deadline - time.monotonic()))
                if w.process.is_alive():
                    w.process.kill()
                    await asyncio.to_thread(w.process.join, 2)
            self._close(w)
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

    def _background(self, coro: Any) -> None:
        task = self._running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(self.settings.retry_after_s)}

    async def _spawn(self, w: Worker) -> None:
        parent, child = socket.socketpair()
        options = {
            "memory_budget_bytes": self.settings.memory_budget_bytes,
            "torch_threads": self.threads,
            "cuda_device": (w.index % self._gpus) if self._gpus else None,
            "heartbeat_s": self.settings.worker_timeout_s / 4,
            "log_level": self.settings.log_level,
        }
        proc = self._ctx.Process(
            target=worker_main,
            args=(w.index, child, self.specs, options),
            name=f"attrserve-worker-{w.index}-{self.name}",
            daemon=True,
        )
        # starting a process forks/execs; off the loop so requests keep flowing meanwhile
        await asyncio.to_thread(proc.start)
        child.close()  # so the channel reports EOF when the worker dies
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        w.generation += 1
        w.process, w.writer, w.state, w.pid = proc, writer, "starting", proc.pid
        w.outstanding.clear()
        w.last_heard = time.monotonic() + STARTUP_GRACE_S
        self._background(self._read(w, reader, w.generation))

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the pool was started on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("the worker pool has not been started")
        return self._loop

    async def _read(self, w: Worker, reader: asyncio.StreamReader, generation: int) -> None:
        try:
            while generation == w.generation:
                msg = await read_message(reader)
                self._on_message(w, generation, msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            code = w.process.exitcode if w.process is not None else None
            how = "" if code is None else f" with code {code}"
            self._on_dead(w, generation, f"its process exited{how}", crashed=True)

    async def _supervise(self) -> None:
        """Kill workers that stopped answering, or that do not stop cancelled work."""
        timeout = self.settings.worker_timeout_s
        while not self._stopping:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for w in self.workers:
                if w.state not in ("starting", "ready", "busy"):
                    continue
                silent = now - w.last_heard
                running = w.outstanding[0] if w.outstanding else None
                if silent > timeout:
                    self._kill(w, f"no heartbeat for {silent:.1f} s")
                elif (
                    running is not None
                    and running.abandoned_at is not None
                    and now - running.abandoned_at > timeout
                ):
                    self._kill(w, f"cancelled work still running after {timeout:g} s")

    def _kill(self, w: Worker, reason: str) -> None:
        log.warning("attrserve: worker %d (pid %s) killed: %s", w.index, w.pid, reason)
        if w.process is not None:
            with contextlib.suppress(Exception):
                w.process.kill()
        self._on_dead(w, w.generation, reason)

    def _close(self, w: Worker) -> None:
        if w.writer is not None:
            with contextlib.suppress(Exception):
                w.writer.close()
        w.writer = None

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

    def queue_depth(self) -> int:
        """Requests not yet computing: in the parent's queue or ready behind a worker's batch."""
        waiting = sum(len(p.entries) for p in self._waiting)
        return waiting + sum(
            len(p.entries) for w in self.workers for p in itertools.islice(w.outstanding, 1, None)
        )

    def status(self) -> list[dict[str, Any]]:
        return [
            {
                "index": w.index,
                "group": self.name,
                "pid": w.pid,
                "state": w.state,
                "restarts": w.restarts,
                "last_restart_reason": w.reason,
            }
            for w in self.workers
        ]

    # -- submission ------------------------------------------------------------------------
    def submit(self, job: Job) -> Entry:
        if not self.workers:
            raise NotReady("this server runs no workers")
        if self._draining:
            raise NotReady("the server is shutting down", headers=self._retry())
        state, reason = self.model_state(job.model_id)
        if state == FAILED:
            raise ModelUnavailable.of(job.model_id, reason, headers=self._retry())
        if job.background:
            entry = Entry(job, self._running_loop().create_future())
            entry.pending = Pending(next(self._ids), [entry], job.cost, None, background=True)
            self._jobs.append(entry.pending)
            self._dispatch()
            return entry
        if self.queue_depth() >= self.settings.queue_size:
            self.telemetry.rejected.inc()
            raise QueueFull(
                f"{self.settings.queue_size} requests are already waiting; retry shortly",
                headers=self._retry(),
            )
        rows = self._piece_rows(job)
        if rows is not None:
            return self._split(job, rows)
        self._dispatch_one(entry := Entry(job, self._running_loop().create_future()))
        return entry

    def _fits(self, cost: int, job: Job) -> bool:
        """Whether a merged batch of ``cost`` (like ``job``) is within bounds: the cost cap, and
        about one piece of compute (``split_ms``), so merging does not undo the split."""
        if cost > self.settings.batch_max_cost:
            return False
        rate = self._rate.get((job.model_id, job.method))
        limit = self.settings.split_ms
        return not limit or rate is None or cost * rate <= limit

    def _piece_rows(self, job: Job) -> int | None:
        """Examples per piece when ``job`` is worth splitting (about ``split_ms`` each, once
        the model's compute rate is known); None: it goes whole."""
        rate = self._rate.get((job.model_id, job.method))
        limit = self.settings.split_ms
        if not limit or rate is None or job.key is None or job.n < 2:
            return None
        if job.verify or job.generation is not None:
            return None
        per_example = rate * job.cost / job.n
        rows = max(1, int(limit / max(per_example, 1e-9)))
        return rows if rows < job.n else None

    def _split(self, job: Job, rows: int) -> Entry:
        """One entry for the request, its pieces queued on their own (never merged, each to
        an idle worker only), and their replies joined when all are in."""
        loop = self._running_loop()
        whole = Entry(job, loop.create_future())
        whole.parts = [Entry(piece, loop.create_future()) for piece in split.pieces(job, rows)]
        for part in whole.parts:
            part.group = self
            self._dispatch_one(part, piece=True)
            part.future.add_done_callback(lambda _: self._joined(whole))
        return whole

    def _joined(self, whole: Entry) -> None:
        if whole.future.done():
            return
        for part in whole.parts:
            if not part.future.done():
                continue
            failed = part.future.cancelled() or part.future.exception() is not None
            if failed or part.future.result().error is not None:
                for other in whole.parts:
                    self.cancel(other)
                if part.future.cancelled():
                    whole.future.cancel()
                elif part.future.exception() is not None:
                    whole.future.set_exception(part.future.exception())  # type: ignore[arg-type]
                else:
                    error = part.future.result().error
                    whole.future.set_result(Reply(job_id=whole.job.id, error=error))
                return
        if all(p.future.done() for p in whole.parts):
            whole.dispatched = min(p.dispatched for p in whole.parts)
            replies = [p.future.result() for p in whole.parts]
            whole.future.set_result(split.join(whole.job, replies))

    def _dispatch_one(self, entry: Entry, *, piece: bool = False) -> None:
        job = entry.job
        key = job.key if self.settings.batching and not piece else None
        pending = self._by_key.get(key) if key is not None else None
        if pending is not None and self._fits(pending.cost + job.cost, job):
            pending.entries.append(entry)
            pending.cost += job.cost
        else:
            pending = Pending(next(self._ids), [entry], job.cost, key, closed=True, piece=piece)
            self._waiting.append(pending)
            if key is not None:
                self._by_key[key] = pending
                window = self.settings.batch_window_ms / 1e3
                if window > 0:
                    pending.closed = False
                    self._running_loop().call_later(window, self._close_window, pending)
        entry.pending = pending
        if pending.key is not None and not self._fits(pending.cost + 1, job):
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
        pending.cost -= entry.job.cost
        w = pending.worker
        if w is None:  # still queued here
            if not pending.entries:
                with contextlib.suppress(ValueError):
                    (self._jobs if pending.background else self._waiting).remove(pending)
                if pending.key is not None and self._by_key.get(pending.key) is pending:
                    del self._by_key[pending.key]
        else:
            if not pending.entries:
                pending.abandoned_at = time.monotonic()
            self._write(w, ("cancel", [entry.job.id]))
        self.telemetry.queue_depth.set(self.queue_depth())

    def _close_window(self, pending: Pending) -> None:
        pending.closed = True
        self._dispatch()

    def _next(self) -> Pending | None:
        """The batch to send next: the cheapest (its estimated compute, less ``AGING`` times
        the time it has waited, so expensive work is never starved), ready for a worker; with
        ``split_ms`` 0, the oldest."""
        if not self.settings.split_ms:
            return next((p for p in self._waiting if p.closed), None)
        now = time.monotonic()
        best, best_at = None, 0.0
        for p in self._waiting:
            if not p.closed:
                continue
            at = self._estimate(p) - AGING * 1e3 * (now - p.queued_at)
            if best is None or at < best_at:
                best, best_at = p, at
        return best

    def _estimate(self, pending: Pending) -> float:
        """A batch's compute in ms, as its model's recent rate says (0: not known yet)."""
        if not pending.entries:
            return 0.0
        job = pending.entries[0].job
        return pending.cost * self._rate.get((job.model_id, job.method), 0.0)

    def _growable(self, pending: Pending) -> bool:
        """Whether requests arriving now could still join this batch."""
        return pending.key is not None and self._by_key.get(pending.key) is pending

    # -- jobs beside synchronous requests ---------------------------------------------------
    def _account(self, background: bool, seconds: float) -> None:
        """Worker time by kind, decaying with a 10 s half-life."""
        now = time.monotonic()
        decay = 0.5 ** ((now - self._busy_at) / 10.0)
        self._busy_at = now
        for kind in self._busy:
            self._busy[kind] *= decay
        self._busy[background] += seconds

    def _owed(self) -> bool:
        """Whether jobs got less than their share of recent worker time."""
        share = self.settings.job_share
        total = self._busy[True] + self._busy[False]
        return share > 0 and (total == 0 or self._busy[True] < share * total)

    def _dispatch_jobs(self, waiting_sync: bool) -> None:
        """Job chunks to idle workers: when no synchronous request waits, or when owed."""
        while self._jobs and (not waiting_sync or self._owed()):
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
        if self._owed():
            return
        queued = self._next() is not None
        for w in self.workers:
            running = w.outstanding[0] if w.outstanding else None
            if running is None or not running.background or running.preempted:
                continue
            if queued or len(w.outstanding) > 1:  # a synchronous batch waits behind it
                running.preempted = True
                self._write(w, ("cancel", [e.job.id for e in running.entries]))

    def _dispatch(self) -> None:
        if self._jobs and self._owed():
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
            limit = self.settings.split_ms
            big = pending.piece or (limit > 0 and self._estimate(pending) > limit)
            depth = 1 if self._growable(pending) or big else DEPTH
            live = [w for w in self.workers if w.state in ("ready", "busy")]
            free = [w for w in live if len(w.outstanding) < depth]
            if not free:
                break
            self._waiting.remove(pending)
            if pending.key is not None and self._by_key.get(pending.key) is pending:
                del self._by_key[pending.key]
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
        w.outstanding.append(pending)
        self.telemetry.batch_size.observe(len(pending.entries))
        if len(pending.entries) > 1:
            self.telemetry.merged.inc(len(pending.entries))
        self._write(w, ("batch", Batch(pending.id, [e.job for e in pending.entries])))

    def _write(self, w: Worker, message: Any) -> None:
        """Queue a message for the worker (the transport buffers it; never blocks)."""
        try:
            if w.writer is None or w.writer.is_closing():
                raise ConnectionError("the worker has no channel")
            w.writer.write(frame(message))
        except (ConnectionError, OSError, RuntimeError):
            self._running_loop().call_soon(self._on_dead, w, w.generation, "its channel broke")

    # -- worker messages -------------------------------------------------------------------
    def _on_message(self, w: Worker, generation: int, msg: tuple[Any, ...]) -> None:
        if generation != w.generation:
            return
        w.last_heard = time.monotonic()
        kind = msg[0]
        if kind == "beat":
            return
        if kind == "ready":
            w.state, w.pid, w.failures = "ready", msg[1]["pid"], 0
            w.models = msg[1]["models"]
            self.model_info = w.models
            self.load_errors = dict(msg[1]["failed"])
            self.crash = None
            models = ", ".join(f"{m} ({i['device']})" for m, i in self.model_info.items())
            log.info("attrserve: worker %d (pid %s) serves %s", w.index, w.pid, models)
            self._fail_waiting()
        elif kind == "failed":
            w.state = "failed"
            w.failures += 1
            w.reason = "it failed to load the models"
            failed, error = msg[1]["models"], msg[1]["error"]
            self.load_errors = {s.id: failed.get(s.id, error) for s in self.specs}
            for mid, why in self.load_errors.items():
                log.error("attrserve: model %r (group %r) failed to load: %s", mid, self.name, why)
            self._fail_waiting()
        elif kind == "done":
            pending = w.outstanding.popleft() if w.outstanding else None
            if not w.outstanding:
                w.state = "ready"
            if pending is not None:
                self._done(pending, msg[2])
        self._dispatch()

    def _done(self, pending: Pending, replies: list[Reply]) -> None:
        started = min((e.dispatched for e in pending.entries), default=time.perf_counter())
        self._account(pending.background, time.perf_counter() - started)
        self._learn(pending, replies)
        by_id = {e.job.id: e for e in pending.entries}
        for reply in replies:
            entry = by_id.get(reply.job_id)
            if entry is None or entry.future.done():
                continue
            cancelled = reply.error is not None and reply.error.get("code") == "cancelled"
            if pending.preempted and cancelled:  # stopped for synchronous work: the job's
                reply = Reply(job_id=reply.job_id, error=PREEMPTED)  # runner tries a smaller one
            entry.future.set_result(reply)

    def _fail_waiting(self) -> None:
        """Answer the queued requests of models now "failed" at once (503 naming the model)."""
        for pending in list(self._waiting):
            for e in list(pending.entries):
                state, reason = self.model_state(e.job.model_id)
                if state == FAILED:
                    if not e.future.done():
                        e.future.set_exception(
                            ModelUnavailable.of(e.job.model_id, reason, headers=self._retry())
                        )
                    pending.entries.remove(e)
                    pending.cost -= e.job.cost
            if not pending.entries:
                self._waiting.remove(pending)
                if pending.key is not None and self._by_key.get(pending.key) is pending:
                    del self._by_key[pending.key]

    def _learn(self, pending: Pending, replies: list[Reply]) -> None:
        """The compute per unit of cost (ms per forward row) of the model and method, a moving
        average."""
        done = [r for r in replies if r.error is None and r.compute_ms > 0]
        if not done or pending.cost <= 0 or not pending.entries:
            return
        job = pending.entries[0].job
        rate = max(r.compute_ms for r in done) / pending.cost  # merged: one shared call
        old = self._rate.get((job.model_id, job.method))
        self._rate[job.model_id, job.method] = rate if old is None else 0.7 * old + 0.3 * rate

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
                            f"the worker serving model {e.job.model_id!r} was lost ({reason}); "
                            "it is being restarted",
                            headers=self._retry(),
                        )
                    )
            # batches that never started wait for a worker again, at the head of the queue
            for p in reversed(w.outstanding):
                p.worker = None
                (self._jobs if p.background else self._waiting).appendleft(p)
            w.outstanding.clear()
        failed = w.state == "failed"
        w.state = "failed" if failed else "dead"
        w.generation += 1
        if not failed:
            w.reason = reason
            if crashed and not self.live and not self._stopping:
                self.crash = f"its worker crashed ({reason}); it is being restarted"
                log.error("attrserve: group %r: %s", self.name, self.crash)
                self._fail_waiting()
        process = w.process
        if process is not None:  # reap it off the loop
            self._background(asyncio.to_thread(process.join, 5))
        if self._stopping:
            return
        self.telemetry.restarts.inc()
        w.restarts += 1
        delay = min(30.0, 0.5 * 2 ** min(w.failures, 6)) if failed else 0.0
        self._running_loop().call_later(delay, self._respawn, w)
        self._dispatch()

    def _respawn(self, w: Worker) -> None:
        if not self._stopping:
            self._background(self._spawn(w))
