"""What the worker pool keeps track of: requests queued (``Entry``), the batches they form
(``Pending``), and each worker process (or thread) with the batches it holds (``Worker``)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.core.work import Reply, Work

#: the reply of a job chunk stopped for synchronous work (``Work.background``)
PREEMPTED = {"code": "preempted", "detail": "stopped for synchronous requests", "errors": []}
#: batches a worker holds: one computing, one (sealed) ready behind it
DEPTH = 2
#: a spawned worker's grace before its first heartbeat (interpreter start, imports)
STARTUP_GRACE_S = 60.0


@dataclass(eq=False)
class Pending:
    id: int
    entries: list[Entry]
    cost: int
    key: tuple[Any, ...] | None
    closed: bool = False  # the window (if any) has passed: ready for a worker
    worker: Worker | None = None  # set once sent
    #: when its last live request was cancelled while a worker had it
    abandoned_at: float | None = None
    #: a job chunk (``Work.background``); preempted: told to stop for synchronous work, it
    #: queues again when the worker gives it back
    background: bool = False
    preempted: bool = False
    #: a piece of a split synchronous request (``service.pool.split``): to an idle worker only
    piece: bool = False
    #: torch threads it computes on (``service.pool.cores``), set when it is sent; timed: big
    #: enough for more, its time compares one thread with more (``Costs.parallel``)
    threads: int = 1
    timed: bool = False
    queued_at: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class Entry:
    work: Work
    future: asyncio.Future[Reply]
    dispatched: float = 0.0
    pending: Pending | None = None
    #: the worker group that took it (``service.pool.group.Group``), which cancels it
    group: Any = None
    #: a split request: its pieces, each queued as an entry of its own
    parts: list[Entry] = field(default_factory=list)
    #: a piece: the request it is part of
    whole: Entry | None = None
    #: where the work's events go as they come (a stream), before its reply
    on_event: Callable[[Any], None] | None = None

    def event(self, payload: Any) -> None:
        """The work's event to its waiter (none: the request is gone or does not listen)."""
        if self.on_event is not None and not self.future.done():
            self.on_event(payload)


class Handle(Protocol):
    """A worker's process, or its thread (``service.pool.inthread``): what the pool asks."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def start(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...


@dataclass(eq=False)
class Worker:
    index: int
    process: Handle | None = None
    writer: asyncio.StreamWriter | None = None
    state: str = "starting"  # starting | ready | busy | dead | failed
    #: batches sent and not answered, oldest (computing) first
    outstanding: deque[Pending] = field(default_factory=deque)
    restarts: int = 0
    pid: int | None = None
    generation: int = 0
    failures: int = 0
    last_heard: float = 0.0  # time.monotonic() of the last message (or the grace's end)
    reason: str | None = None  # why it was last restarted
    #: what the worker reported of each model when it became ready
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    def sent(self, work_id: int) -> Entry | None:
        """The entry of a job sent to this worker and not answered yet."""
        return next((e for p in self.outstanding for e in p.entries if e.work.id == work_id), None)
