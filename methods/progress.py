"""``progress=True``: a tqdm bar on stderr over an attribution's model evaluations (Captum's
``show_progress``).

The bar lives in a ContextVar for the duration of one ``methods.attribute`` call (a tqdm bar,
or anything with its ``total``, ``n``, ``update`` and ``refresh``). Every
evaluation loop of the engine (chunks of path rows, batches of perturbations) says how many
evaluations it will make when it starts (``expect``) and counts them as they finish
(``done``); a method whose loops nest (a noise tunnel over a chunked method) grows the total
as each inner loop starts. Without a bar both are one ContextVar read.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any

_bar: contextvars.ContextVar[Any] = contextvars.ContextVar("methods_progress", default=None)


@contextlib.contextmanager
def shown(enabled: bool, description: str) -> Iterator[None]:
    """Show a bar (on stderr) while the block runs, when ``enabled``; closed on the way out."""
    if not enabled or _bar.get() is not None:  # nested attributions share the outer bar
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=0, desc=description, unit="eval", file=sys.stderr, dynamic_ncols=True)
    token = _bar.set(bar)
    try:
        yield
    finally:
        _bar.reset(token)
        bar.close()


def expect(n: int) -> None:
    """An evaluation loop is starting: ``n`` more evaluations to come."""
    bar = _bar.get()
    if bar is not None and n > 0:
        bar.total += int(n)
        bar.refresh()


def done(n: int) -> None:
    """``n`` evaluations have finished."""
    bar = _bar.get()
    if bar is not None and n > 0:
        bar.update(int(n))


def mark() -> tuple[float, float] | None:
    """Where the bar stands (its total and count), for ``rewind``; None without a bar."""
    bar = _bar.get()
    return None if bar is None else (bar.total, bar.n)


def rewind(at: tuple[float, float] | None) -> None:
    """Back to ``mark()``'s place: work that is to be run again is counted once."""
    bar = _bar.get()
    if bar is not None and at is not None:
        bar.total, bar.n = at
        bar.refresh()
