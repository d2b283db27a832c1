"""A worker in a thread of the server process (``ATTRSERVE_WORKER_MODE=thread``): the worker's
loop (``service.worker.main.worker_main``) over the same socket-pair channel and messages, so
the group's queue, batching, dispatch, cancellation, events and replies take the very path they
take with a process; only the start is different, and what a thread cannot do.

For tests and development (no process to start: a server is up in the time its models load);
the service runs processes. What degrades, and how:

- No isolation: a crash of the worker (a segfault in C code, ``os._exit``) is the server's.
- ``kill`` cannot stop a thread: it shuts the channel down, so the worker stops at its next
  checkpoint and ends; one hung in C code stays until its call returns (its messages are
  ignored: the group has already restarted it as a new thread, which loads the models again).
- Process-wide state is the server's: torch's thread counts (a batch's ``threads`` are not
  applied), the visible GPUs (``CUDA_VISIBLE_DEVICES`` per worker), MKL's reproducible mode
  (read at MKL's first call, in the server), the memory budget (one for the whole process).
- ``pid`` is the server's.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from typing import Any

from model_registry.spec import ModelSpec
from service.worker.main import worker_main


class WorkerThread:
    """What ``Processes`` asks of a worker's process (start, join, is_alive, kill, pid,
    exitcode), for a worker thread that owns its end of the channel."""

    def __init__(
        self,
        index: int,
        sock: socket.socket,
        specs: list[ModelSpec],
        options: dict[str, Any],
        name: str,
    ) -> None:
        self._sock = sock
        self._thread = threading.Thread(
            target=self._run, args=(index, specs, {**options, "in_thread": True}), name=name
        )
        self._thread.daemon = True
        self.pid: int | None = None
        #: a thread has no exit status
        self.exitcode: int | None = None

    def _run(self, index: int, specs: list[ModelSpec], options: dict[str, Any]) -> None:
        try:
            worker_main(index, self._sock, specs, options)
        finally:  # as a process's exit: the parent reads EOF
            self.kill()
            self._sock.close()

    def start(self) -> None:
        self._thread.start()
        self.pid = os.getpid()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def kill(self) -> None:
        """Shut the channel down: the worker's reads end (it stops at its next checkpoint),
        its writes fail, and the parent reads EOF."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
