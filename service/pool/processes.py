"""A worker group's processes: spawn, the channel, heartbeats and supervision, kill, restart.

Each worker is a process (forked from a forkserver that has imported what workers need:
``start_method``) with one socket-pair channel (``service.worker.channel``) that
the event loop reads and writes through asyncio streams: the loop never blocks on a worker.
Workers send heartbeats. One silent for ``worker_timeout_s`` (stopped, hung in C code, swapped
out), or still busy ``worker_timeout_s`` after its whole batch was cancelled, is killed and
restarted. What a worker says (``_on_message``, the messages of ``service.worker.messages``)
and what losing one means for the requests it held (``_on_dead``) belong to the group
(``service.pool.group``).

With ``worker_mode = "thread"`` each worker is a thread of this process instead
(``service.pool.inthread``, which says what a thread cannot do), on the same channel: all of
the above but the start is the same code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import os
import socket
import time
from collections.abc import Sequence
from typing import Any

from model_registry import sources
from model_registry.spec import ModelSpec
from service.core.settings import Settings
from service.pool.cores import Cores
from service.pool.inthread import WorkerThread
from service.pool.records import STARTUP_GRACE_S, Handle, Worker
from service.worker import preload
from service.worker.channel import frame, read_message
from service.worker.main import worker_main
from service.worker.messages import FromWorker, Stop, ToWorker

log = logging.getLogger("attrserve.pool")
#: what every worker imports before it can load a model; the forkserver imports these once and
#: each worker forks from it. Measured (tests' models.toml, six models in six groups, 2 cores):
#: the server ready in 15.7 s with each worker a spawned interpreter importing torch, in
#: 5.5 s forked from the preloaded server; a worker restarted after a crash in
#: ~0.2 s against ~3 s. The server never imports CUDA state into it (import only, no call).
PRELOAD = [
    "torch",
    "methods",
    "model_registry",
    "service.kinds",
    "service.worker.main",
    "service.worker.preload",  # what the models' sources name (start_method), each guarded
]


#: MKL's conditional numerical reproducibility: the code path its CPU check picks, and the same
#: bits whatever the thread count
REPRODUCIBLE_MKL = "AUTO,STRICT"


def start_method(specs: Sequence[ModelSpec]) -> Any:
    """The workers' multiprocessing context: forkserver with ``PRELOAD`` and what ``specs``'
    sources preload, where the platform has it (Linux), else spawn. Never plain fork: the
    server process has threads (the event loop's executors) and may hold CUDA state.

    Every group is made before the first worker starts, so the forkserver imports what all
    the pool's models need; a model loaded later imports its own in its worker.

    The workers compute their matrix products in MKL's strict reproducible mode: a batch's
    thread count follows the load and the measured rates (``service.pool.cores``), and MKL
    otherwise splits a product's sums by its threads, so the same request moved in its last
    bits with them (infidelity in its fifth digit: CONTRACT 9.1 wants the same bits). MKL
    reads the variable at its first call in a process: the workers' come after it is set. A
    value the operator set is kept."""
    os.environ.setdefault("MKL_CBWR", REPRODUCIBLE_MKL)
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    preload.declare(sources.preload(specs))  # the forkserver inherits the environment
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


class Processes:
    """``workers``: the indices of the worker processes (unique across groups: logs, GPUs);
    ``cores``: the cores the workers share (each batch says its threads)."""

    def __init__(
        self, name: str, settings: Settings, specs: list[ModelSpec], workers: range, cores: Cores
    ) -> None:
        self.name = name
        self.settings = settings
        self.specs = specs
        self.cores = cores
        self.workers = [Worker(i) for i in workers]
        self._in_thread = settings.worker_mode == "thread"
        self._ctx = None if self._in_thread else start_method(specs)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._gpus = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- what the group decides ------------------------------------------------------------
    def _on_message(self, w: Worker, generation: int, msg: FromWorker) -> None:
        raise NotImplementedError

    def _on_dead(self, w: Worker, generation: int, reason: str, *, crashed: bool = False) -> None:
        raise NotImplementedError

    # -- start and stop --------------------------------------------------------------------
    async def _start_processes(self) -> None:
        self._loop = asyncio.get_running_loop()
        import torch

        self._gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.workers:
            self._background(self._supervise())
        for w in self.workers:
            await self._spawn(w)

    async def _stop_processes(self) -> None:
        """Stop the workers: politely, then by force."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        for w in self.workers:
            if w.writer is not None:
                with contextlib.suppress(Exception):
                    w.writer.write(frame(Stop()))
        deadline = time.monotonic() + 5
        for w in self.workers:
            if w.process is not None:
                await asyncio.to_thread(w.process.join, max(0.0, deadline - time.monotonic()))
                if w.process.is_alive():
                    w.process.kill()
                    await asyncio.to_thread(w.process.join, 2)
            self._close(w)

    def _background(self, coro: Any) -> None:
        task = self._running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop the group was started on (set by ``start``)."""
        if self._loop is None:
            raise RuntimeError("the worker pool has not been started")
        return self._loop

    # -- one worker ------------------------------------------------------------------------
    async def _spawn(self, w: Worker) -> None:
        parent, child = socket.socketpair()
        options = {
            "memory_budget_bytes": self.settings.memory_budget_bytes,
            "torch_threads": self.cores.fixed or 1,
            "cuda_device": (w.index % self._gpus) if self._gpus else None,
            "heartbeat_s": self.settings.worker_timeout_s / 4,
            "log_level": self.settings.log_level,
        }
        name = f"attrserve-worker-{w.index}-{self.name}"
        proc: Handle
        if self._ctx is None:  # thread mode: the thread owns the child's end
            proc = WorkerThread(w.index, child, self.specs, options, name)
        else:
            proc = self._ctx.Process(
                target=worker_main,
                args=(w.index, child, self.specs, options),
                name=name,
                daemon=True,
            )
        # the start itself is in the grace (the first one also starts the forkserver, which
        # imports PRELOAD: seconds), so the supervisor never takes a starting worker for dead
        w.state, w.last_heard = "starting", time.monotonic() + STARTUP_GRACE_S
        # starting a process forks/execs; off the loop so requests keep flowing meanwhile
        try:
            await asyncio.to_thread(proc.start)
        except (OSError, EOFError) as exc:  # no process (no memory, the forkserver gone)
            parent.close()
            child.close()
            reason = f"its process could not start ({exc!r})"
            log.error("attrserve: worker %d: %s", w.index, reason)
            # as a failed load: tried again after a pause that grows with each failure
            w.state, w.reason, w.failures = "failed", reason, w.failures + 1
            self._on_dead(w, w.generation, reason)
            return
        if self._ctx is not None:
            child.close()  # so the channel reports EOF when the worker dies
        reader, writer = await asyncio.open_unix_connection(sock=parent)
        w.generation += 1
        w.process, w.writer, w.state, w.pid = proc, writer, "starting", proc.pid
        w.outstanding.clear()
        w.last_heard = time.monotonic() + STARTUP_GRACE_S
        self._background(self._read(w, reader, w.generation))

    async def _read(self, w: Worker, reader: asyncio.StreamReader, generation: int) -> None:
        try:
            while generation == w.generation:
                msg = await read_message(reader)
                self._on_message(w, generation, msg)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            code = w.process.exitcode if w.process is not None else None
            how = "" if code is None else f" with code {code}"
            self._on_dead(w, generation, f"its process exited{how}", crashed=True)

    def _write(self, w: Worker, message: ToWorker) -> None:
        """Queue a message for the worker (the transport buffers it; never blocks)."""
        try:
            if w.writer is None or w.writer.is_closing():
                raise ConnectionError("the worker has no channel")
            w.writer.write(frame(message))
        except (ConnectionError, OSError, RuntimeError):
            self._running_loop().call_soon(self._on_dead, w, w.generation, "its channel broke")

    async def _supervise(self) -> None:
        """Kill workers that stopped answering, or that do not stop cancelled work."""
        timeout = self.settings.worker_timeout_s
        while not self._stopping:
            await asyncio.sleep(min(1.0, timeout / 4))
            now = time.monotonic()
            for w in self.workers:
                # not spawned yet (the pool starts its workers one by one, the supervisor
                # first): its grace has not begun, and 0.0 would read as hours of silence
                if w.state not in ("starting", "ready", "busy") or w.process is None:
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

    def _restart(self, w: Worker) -> bool:
        """Reap a lost worker off the loop and start another: at once, or after a pause that
        grows with its failures to load (up to 30 s). False while stopping (no restart)."""
        failed = w.state == "failed"
        process = w.process
        if process is not None:
            self._background(asyncio.to_thread(process.join, 5))
        if self._stopping:
            return False
        w.restarts += 1
        delay = min(30.0, 0.5 * 2 ** min(w.failures, 6)) if failed else 0.0
        self._running_loop().call_later(delay, self._respawn, w)
        return True

    def _respawn(self, w: Worker) -> None:
        if not self._stopping:
            self._background(self._spawn(w))
