"""What the parent and a worker say to each other over their channel: one frozen dataclass per
kind of message, dispatched by its type.

Parent -> worker: a ``Batch`` (``service.core.work``) to compute, ``Cancel`` and ``Stop``.
Worker -> parent: ``Ready`` or ``StartFailed`` once, then heartbeats (``Heartbeat``), and for
each batch its jobs' ``Event`` messages and one ``Replied``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.core.work import Batch, Reply


@dataclass(frozen=True)
class Cancel:
    """Stop these jobs: dropped if not started, the engine stopped at its next checkpoint
    once every job of the running batch is cancelled."""

    work_ids: tuple[int, ...]


@dataclass(frozen=True)
class Stop:
    """Finish: no batch follows (the running one stops at its next checkpoint)."""


@dataclass(frozen=True)
class Ready:
    """The worker serves ``models`` (what it reports of each: device, tokenizer, its kind's
    set-up); ``failed``: the models it could not load, with the reason."""

    pid: int
    models: dict[str, dict[str, Any]]
    failed: dict[str, str]


@dataclass(frozen=True)
class StartFailed:
    """The worker cannot serve: ``error`` says why, ``models`` why each model did not load
    (those it did not name failed with ``error``). It ends after saying so."""

    error: str
    models: dict[str, str]


@dataclass(frozen=True)
class Heartbeat:
    """The worker is alive (sent from its start, every quarter of ``worker_timeout_s``)."""


@dataclass(frozen=True)
class Event:
    """A running job's event (``service.core.events``) for its waiter, before its reply."""

    work_id: int
    payload: Any


@dataclass(frozen=True)
class Replied:
    """Batch ``batch_id`` is done: one reply per job (errors as data)."""

    batch_id: int
    replies: list[Reply]


#: what the parent sends
ToWorker = Batch | Cancel | Stop
#: what a worker sends
FromWorker = Ready | StartFailed | Heartbeat | Event | Replied
