"""The parent side of the worker pool: a bounded queue, adaptive batching and dispatch.

Each worker is a spawned process with one duplex pipe, watched by the event loop itself (no
reader thread). Dispatch is adaptive: an idle worker gets a request at once; while a worker is
computing, requests that may share an engine call (same merge key) wait together and go as one
batch, up to the cost cap, when it is idle again. A sealed batch (full, or of requests that never
merge, as with batching off) may also wait in a worker's ready slot behind the one computing, so
the worker need not wait for the parent between batches; a batch that can still grow does not,
since everything arriving during the computation would otherwise form yet another small batch.
``batch_window_ms`` > 0 also holds a new batch open that long for companions even when a worker
is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from model_registry.spec import ModelSpec
from service.errors import NotReady, QueueFull, ServiceError, WorkerLost
from service.pool import threads
from service.pool.jobs import Batch, Job, Reply
from service.pool.worker import worker_main
from service.settings import Settings
from service.telemetry import Telemetry

#: batches a worker holds: one computing, one (sealed) ready behind it
DEPTH = 2


@dataclass
class Entry:
    job: Job
    future: asyncio.Future[Reply]
    submitted: float = field(default_factory=time.perf_counter)
    dispatched: float = 0.0


@dataclass
class Pending:
    id: int
    entries: list[Entry]
    cost: int
    key: tuple[Any, ...] | None
    closed: bool = False  # the window (if any) has passed: ready for a worker


@dataclass
class Worker:
    index: int
    process: BaseProcess | None = None
    conn: Connection | None = None
    state: str = "starting"  # starting | ready | busy | dead | failed
    #: batches sent and not answered, oldest (computing) first
    outstanding: deque[Pending] = field(default_factory=deque)
    restarts: int = 0
    pid: int | None = None
    generation: int = 0
    failures: int = 0
    watched: int | None = None  # the pipe's fd while the event loop watches it


class WorkerPool:
    def __init__(
        self, settings: Settings, specs: list[ModelSpec], telemetry: Telemetry, n_workers: int
    ) -> None:
        self.settings = settings
        self.specs = specs
        self.telemetry = telemetry
        self.workers = [Worker(i) for i in range(n_workers)]
        self.model_info: dict[str, dict[str, Any]] = {}
        self._ctx = mp.get_context("spawn")
        self._ids = itertools.count(1)
        self._waiting: deque[Pending] = deque()
        self._by_key: dict[tuple[Any, ...], Pending] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._gpus = 0

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        import torch

        self._gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.workers:  # this process only parses and routes: it must not hog cores
            threads.limit(1)
        for w in self.workers:
            self._spawn(w)

    async def stop(self) -> None:
        self._stopping = True
        for w in self.workers:
            self._unwatch(w)
            if w.conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    w.conn.send(None)
        deadline = time.monotonic() + 5
        for w in self.workers:
            if w.process is not None:
                await asyncio.to_thread(w.process.join, max(0.0, deadline - time.monotonic()))
                if w.process.is_alive():
                    w.process.kill()
                    w.process.join(1)
        for p in [*self._waiting, *(p for w in self.workers for p in w.outstanding)]:
            for e in p.entries:
                if not e.future.done():
                    e.future.set_exception(NotReady("the server is shutting down"))
        self._waiting.clear()
        self._by_key.clear()

    def _spawn(self, w: Worker) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        options = {
            "memory_budget_bytes": self.settings.memory_budget_bytes,
            "torch_threads": threads.worker_threads(self.settings.torch_threads, len(self.workers)),
            "cuda_device": (w.index % self._gpus) if self._gpus else None,
        }
        proc = self._ctx.Process(
            target=worker_main,
            args=(w.index, child, self.specs, options),
            name=f"attrserve-worker-{w.index}",
            daemon=True,
        )
        proc.start()
        child.close()  # so the pipe reports EOF when the worker dies
        w.generation += 1
        w.process, w.conn, w.state, w.pid = proc, parent, "starting", proc.pid
        w.outstanding.clear()
        self._watch(w, parent, w.generation)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the pool was started on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("the worker pool has not been started")
        return self._loop

    def _watch(self, w: Worker, conn: Connection, generation: int) -> None:
        """Messages from the worker, read on the event loop when its pipe is readable."""
        loop = self._running_loop()
        try:
            loop.add_reader(conn.fileno(), self._readable, w, conn, generation)
            # uvloop (libuv) switches a watched fd to non-blocking; this pipe is read and
            # written whole-message at a time, so a large batch would fail with EAGAIN.
            os.set_blocking(conn.fileno(), True)
            w.watched = conn.fileno()
        except NotImplementedError:  # loops without add_reader: a reader thread instead
            threading.Thread(
                target=self._read_thread,
                args=(w, conn, generation),
                daemon=True,
                name=f"attrserve-reader-{w.index}",
            ).start()

    def _unwatch(self, w: Worker) -> None:
        if w.watched is not None and self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(w.watched)
        w.watched = None

    def _readable(self, w: Worker, conn: Connection, generation: int) -> None:
        try:
            while generation == w.generation and conn.poll():
                self._on_message(w, generation, conn.recv())
        except (EOFError, OSError):
            self._on_dead(w, generation)

    def _read_thread(self, w: Worker, conn: Connection, generation: int) -> None:
        loop = self._running_loop()
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._on_dead, w, generation)
                return
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._on_message, w, generation, msg)

    # -- status ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return bool(self.workers) and all(w.state in ("ready", "busy") for w in self.workers)

    def queue_depth(self) -> int:
        """Requests not yet computing: in the parent's queue or ready behind a worker's batch."""
        waiting = sum(len(p.entries) for p in self._waiting)
        return waiting + sum(
            len(p.entries) for w in self.workers for p in itertools.islice(w.outstanding, 1, None)
        )

    def status(self) -> list[dict[str, Any]]:
        return [
            {"index": w.index, "pid": w.pid, "state": w.state, "restarts": w.restarts}
            for w in self.workers
        ]

    # -- submission ------------------------------------------------------------------------
    def submit(self, job: Job) -> asyncio.Future[Reply]:
        if not self.workers:
            raise NotReady("this server runs no workers")
        if all(w.state == "failed" for w in self.workers):
            raise NotReady("no worker could load the models; see the server log")
        if self.queue_depth() >= self.settings.queue_size:
            self.telemetry.rejected.inc()
            raise QueueFull(
                f"{self.settings.queue_size} requests are already waiting; retry shortly",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )
        entry = Entry(job, self._running_loop().create_future())
        key = job.key if self.settings.batching else None
        pending = self._by_key.get(key) if key is not None else None
        if pending is not None and pending.cost + job.cost <= self.settings.batch_max_cost:
            pending.entries.append(entry)
            pending.cost += job.cost
        else:
            pending = Pending(next(self._ids), [entry], job.cost, key, closed=True)
            self._waiting.append(pending)
            if key is not None:
                self._by_key[key] = pending
                window = self.settings.batch_window_ms / 1e3
                if window > 0:
                    pending.closed = False
                    self._running_loop().call_later(window, self._close, pending)
        if pending.key is not None and pending.cost >= self.settings.batch_max_cost:
            self._by_key.pop(pending.key, None)
            pending.closed = True
        self._dispatch()
        return entry.future

    def _close(self, pending: Pending) -> None:
        pending.closed = True
        self._dispatch()

    def _next(self) -> Pending | None:
        for p in self._waiting:
            if p.closed:
                return p
        return None

    def _growable(self, pending: Pending) -> bool:
        """Whether requests arriving now could still join this batch."""
        return pending.key is not None and self._by_key.get(pending.key) is pending

    def _dispatch(self) -> None:
        while self._waiting:
            pending = self._next()
            if pending is None:
                break
            # A batch that may still grow goes only to an idle worker: what arrives while the
            # worker computes joins it, and bigger batches cost less CPU per request. A sealed
            # batch (full, or never merged) may wait in a worker's ready slot.
            depth = 1 if self._growable(pending) else DEPTH
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
        self.telemetry.queue_depth.set(self.queue_depth())

    def _send(self, w: Worker, pending: Pending) -> None:
        now = time.perf_counter()
        for e in pending.entries:
            e.dispatched = now
        w.state = "busy"
        w.outstanding.append(pending)
        self.telemetry.batch_size.observe(len(pending.entries))
        if len(pending.entries) > 1:
            self.telemetry.merged.inc(len(pending.entries))
        try:
            if w.conn is None:
                raise OSError("the worker has no pipe")
            w.conn.send(Batch(pending.id, [e.job for e in pending.entries]))
        except (OSError, ValueError):
            self._on_dead(w, w.generation)

    # -- worker messages -------------------------------------------------------------------
    def _on_message(self, w: Worker, generation: int, msg: tuple[Any, ...]) -> None:
        if generation != w.generation:
            return
        kind = msg[0]
        if kind == "ready":
            w.state, w.pid, w.failures = "ready", msg[1]["pid"], 0
            self.model_info = msg[1]["models"]
        elif kind == "failed":
            w.state = "failed"
            w.failures += 1
            print(f"attrserve: worker {w.index} failed to start: {msg[1]}", flush=True)
        elif kind == "done":
            pending = w.outstanding.popleft() if w.outstanding else None
            if not w.outstanding:
                w.state = "ready"
            if pending is not None:
                by_id = {e.job.id: e for e in pending.entries}
                for reply in msg[2]:
                    entry = by_id.get(reply.job_id)
                    if entry is not None and not entry.future.done():
                        entry.future.set_result(reply)
        self._dispatch()

    def _on_dead(self, w: Worker, generation: int) -> None:
        if generation != w.generation:
            return
        self._unwatch(w)
        if w.outstanding:
            for e in w.outstanding.popleft().entries:
                if not e.future.done():
                    e.future.set_exception(
                        WorkerLost("the worker serving this request died; it is being restarted")
                    )
            # batches that never started wait for a worker again, at the head of the queue
            self._waiting.extendleft(reversed(w.outstanding))
            w.outstanding.clear()
        failed = w.state == "failed"
        w.state = "failed" if failed else "dead"
        w.generation += 1
        if w.process is not None:
            w.process.join(0.1)
        if self._stopping:
            return
        self.telemetry.restarts.inc()
        w.restarts += 1
        delay = min(30.0, 0.5 * 2 ** min(w.failures, 6)) if failed else 0.0
        self._running_loop().call_later(delay, self._respawn, w)
        self._dispatch()

    def _respawn(self, w: Worker) -> None:
        if not self._stopping:
            self._spawn(w)


def reply_error(reply: Reply) -> ServiceError | None:
    return None if reply.error is None else ServiceError.from_data(reply.error)
