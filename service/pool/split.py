"""A request cut by examples, and its pieces' replies joined back: the job runner's chunks, and
the pool's split of an expensive synchronous request into pieces of about
``ATTRSERVE_SPLIT_MS`` of compute, so a cheap request queued behind it waits for one piece,
not the whole request.

Only a job whose examples are independent is split (one with a merge key: the engine computes
each example alone, so the pieces' answers are the whole request's, exactly).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable
from typing import TypeVar

from service.core.work import Reply, Work, new_id
from service.pool.records import Entry

W = TypeVar("W", bound=Work)


def chunk(work: W, start: int, stop: int) -> W:
    """The work's examples ``[start, stop)`` as work of their own (its type cuts its own
    per-example fields: ``Work.cut``)."""
    return work.cut(start, stop)


def pieces(work: W, rows: int) -> list[W]:
    """``job`` in as few pieces of at most ``rows`` examples as it takes, of sizes within one
    of each other (17 in pieces of 8: 5, 6, 6, not 8, 8, 1), each its own id. A piece of one
    or two examples is what changed a cut request's numbers: MKL computes a product of one or
    two rows on another path (a matrix-vector product) whose sums round otherwise, so a
    saliency's or a DeepLift delta's last bits moved with the cut (CONTRACT 9.1). Even pieces
    of at most ``rows`` have at least half of it: one-example pieces are left to requests
    whose one example is a piece of compute of its own, whose products have many rows."""
    count = -(-work.n // rows)
    bounds = [work.n * i // count for i in range(count + 1)]
    return [
        dataclasses.replace(chunk(work, start, stop), id=new_id())
        for start, stop in itertools.pairwise(bounds)
    ]


def join(work: Work, replies: list[Reply]) -> Reply:
    """The pieces' replies (in order, none failed) as ``job``'s one reply (``Reply.join``)."""
    return Reply.join(work.id, replies)


def split_entry(
    work: Work,
    rows: int,
    loop: asyncio.AbstractEventLoop,
    queue: Callable[[Entry], None],
    cancel: Callable[[Entry], None],
) -> Entry:
    """One entry for the request; its pieces, each an entry of its own, go to ``queue``, and
    their replies are joined into the request's when all are in (the first failure, or a
    cancellation, ends it and ``cancel``s the other pieces)."""
    whole = Entry(work, loop.create_future())
    whole.parts = [Entry(piece, loop.create_future(), whole=whole) for piece in pieces(work, rows)]
    for part in whole.parts:
        queue(part)
        part.future.add_done_callback(lambda _: _settle(whole, cancel))
    return whole


def _settle(whole: Entry, cancel: Callable[[Entry], None]) -> None:
    if whole.future.done():
        return
    for part in whole.parts:
        if not part.future.done():
            continue
        failed = part.future.cancelled() or part.future.exception() is not None
        if failed or part.future.result().error is not None:
            for other in whole.parts:
                cancel(other)
            if part.future.cancelled():
                whole.future.cancel()
            elif (exc := part.future.exception()) is not None:
                whole.future.set_exception(exc)
            else:
                error = part.future.result().error
                whole.future.set_result(Reply(work_id=whole.work.id, error=error))
            return
    if all(p.future.done() for p in whole.parts):
        whole.dispatched = min(p.dispatched for p in whole.parts)
        try:
            joined = join(whole.work, [p.future.result() for p in whole.parts])
        except Exception as exc:  # the request fails now, never waits out its deadline
            whole.future.set_exception(exc)
        else:
            whole.future.set_result(joined)
