"""Events a running piece of work sends before its reply (a stream's tokens): the worker loop
sets where they go for the work it runs (``sink``); the work calls ``emit``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_sink: ContextVar[Callable[[Any], None] | None] = ContextVar("attrserve_event_sink", default=None)


def emit(payload: Any) -> None:
    """Send ``payload`` (plain, picklable data) to whoever waits on the running work; nothing
    when no one does."""
    send = _sink.get()
    if send is not None:
        send(payload)


@contextmanager
def sink(send: Callable[[Any], None] | None) -> Iterator[None]:
    """Within the block, ``emit`` calls ``send``."""
    token = _sink.set(send)
    try:
        yield
    finally:
        _sink.reset(token)
