"""Co-operative cancellation: the engine stops between chunks when its caller says so.

A caller (the service, on a client disconnect or a deadline) wraps ``methods.attribute`` in
``cancel_scope(should_stop)``; the engine calls ``checkpoint()`` before each chunk of work, so
a cancelled attribution stops within about one chunk. Scopes live in a ContextVar: they are
per thread (and per asyncio task), and they nest: any active scope stopping stops the work.
Hooks and temporary model changes are undone by their context managers on the way out.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from methods.errors import AttributionCancelled

ShouldStop = Callable[[], bool]

_scopes: contextvars.ContextVar[tuple[ShouldStop, ...]] = contextvars.ContextVar(
    "methods_cancel_scopes", default=()
)


@contextlib.contextmanager
def cancel_scope(should_stop: ShouldStop) -> Iterator[None]:
    """Within this block, engine work raises ``AttributionCancelled`` at its next checkpoint
    once ``should_stop()`` returns True (it is polled once per chunk, so keep it cheap)."""
    token = _scopes.set((*_scopes.get(), should_stop))
    try:
        yield
    finally:
        _scopes.reset(token)


def checkpoint() -> None:
    """Raise ``AttributionCancelled`` if an active scope says stop; one ContextVar read if none."""
    scopes = _scopes.get()
    if scopes and any(stop() for stop in scopes):
        raise AttributionCancelled("the attribution was cancelled")
