"""Work moved off the event loop, one piece at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

#: bodies above this are parsed (and decoded) in a thread: the event loop keeps answering
OFFLOAD_BYTES = 1 << 20
_offloading: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
T = TypeVar("T")


async def offload(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread, one at a time: parsing and decoding hold the GIL in long C
    calls, and several at once would starve the event loop (and its health checks)."""
    loop = asyncio.get_running_loop()
    gate = _offloading.get(loop)
    if gate is None:
        gate = _offloading[loop] = asyncio.Semaphore(1)
    async with gate:
        return await asyncio.to_thread(fn, *args)


def large(size: int | None) -> bool:
    """Whether a body of ``size`` bytes is parsed and decoded off the event loop."""
    return size is not None and size > OFFLOAD_BYTES


async def offload_if(off: bool, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``: in a thread (``offload``) when ``off``, else here on the event loop (a
    small body decodes faster than a thread hop)."""
    return await offload(fn, *args) if off else fn(*args)
