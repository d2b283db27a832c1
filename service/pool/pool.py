"""The parent side of the worker pool: a bounded queue, dynamic batching and dispatch.

Each worker is a spawned process with one duplex pipe; a reader thread per worker hands its
messages to the event loop. A batch stays open ``batch_window_ms`` for companions with the same
merge key, then waits for an idle worker (still accepting companions, up to the cost cap).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from model_registry.spec import ModelSpec
from service.errors import NotReady, QueueFull, ServiceError, WorkerLost
from service.pool.jobs import Batch, Job, Reply
from service.pool.worker import worker_main
from service.settings import Settings
from service.telemetry import Telemetry


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
    closed: bool = False  # the window has passed: ready for a worker


@dataclass
class Worker:
    index: int
    process: BaseProcess | None = None
    conn: Connection | None = None
    state: str = "starting"  # starting | ready | busy | dead | failed
    batch: Pending | None = None
    restarts: int = 0
    pid: int | None = None
    generation: int = 0
    failures: int = 0


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
        for w in self.workers:
            self._spawn(w)

    async def stop(self) -> None:
        self._stopping = True
        for w in self.workers:
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
        for p in list(self._waiting):
            for e in p.entries:
                if not e.future.done():
                    e.future.set_exception(NotReady("the server is shutting down"))
        self._waiting.clear()
        self._by_key.clear()

    def _spawn(self, w: Worker) -> None:
        parent, child = self._ctx.Pipe(duplex=True)
        options = {
            "memory_budget_bytes": self.settings.memory_budget_bytes,
            "torch_threads": self.settings.torch_threads,
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
        w.process, w.conn, w.state, w.pid, w.batch = proc, parent, "starting", proc.pid, None
        threading.Thread(
            target=self._read,
            args=(w, parent, w.generation),
            daemon=True,
            name=f"attrserve-reader-{w.index}",
        ).start()

    def _read(self, w: Worker, conn: Connection, generation: int) -> None:
        assert self._loop is not None
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._on_dead, w, generation)
                return
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._on_message, w, generation, msg)

    # -- status ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return bool(self.workers) and all(w.state in ("ready", "busy") for w in self.workers)

    def queue_depth(self) -> int:
        return sum(len(p.entries) for p in self._waiting)

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
        assert self._loop is not None
        entry = Entry(job, self._loop.create_future())
        key = job.key if self.settings.batching else None
        pending = self._by_key.get(key) if key is not None else None
        if pending is not None and pending.cost + job.cost <= self.settings.batch_max_cost:
            pending.entries.append(entry)
            pending.cost += job.cost
        else:
            pending = Pending(next(self._ids), [entry], job.cost, key)
            self._waiting.append(pending)
            if key is not None:
                self._by_key[key] = pending
                window = self.settings.batch_window_ms / 1e3
                if window > 0:
                    self._loop.call_later(window, self._close, pending)
                else:
                    pending.closed = True
            else:
                pending.closed = True
        if pending.key is not None and pending.cost >= self.settings.batch_max_cost:
            self._by_key.pop(pending.key, None)
            pending.closed = True
        self.telemetry.queue_depth.set(self.queue_depth())
        self._dispatch()
        return entry.future

    def _close(self, pending: Pending) -> None:
        pending.closed = True
        self._dispatch()

    def _dispatch(self) -> None:
        idle = [w for w in self.workers if w.state == "ready"]
        while idle and self._waiting:
            pending = next((p for p in self._waiting if p.closed), None)
            if pending is None:
                break
            self._waiting.remove(pending)
            if pending.key is not None and self._by_key.get(pending.key) is pending:
                del self._by_key[pending.key]
            pending.entries = [e for e in pending.entries if not e.future.done()]
            if not pending.entries:
                continue
            w = idle.pop()
            now = time.perf_counter()
            for e in pending.entries:
                e.dispatched = now
            w.state, w.batch = "busy", pending
            self.telemetry.batch_size.observe(len(pending.entries))
            if len(pending.entries) > 1:
                self.telemetry.merged.inc(len(pending.entries))
            try:
                assert w.conn is not None
                w.conn.send(Batch(pending.id, [e.job for e in pending.entries]))
            except (OSError, ValueError):
                self._on_dead(w, w.generation)
        self.telemetry.queue_depth.set(self.queue_depth())

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
            pending, w.batch = w.batch, None
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
        pending, w.batch = w.batch, None
        if pending is not None:
            for e in pending.entries:
                if not e.future.done():
                    e.future.set_exception(
                        WorkerLost("the worker serving this request died; it is being restarted")
                    )
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
        assert self._loop is not None
        self._loop.call_later(delay, self._respawn, w)

    def _respawn(self, w: Worker) -> None:
        if not self._stopping:
            self._spawn(w)


def reply_error(reply: Reply) -> ServiceError | None:
    return None if reply.error is None else ServiceError.from_data(reply.error)
