"""The hooks the engine puts on a caller's model, known for as long as a call holds them.

Every method that hooks a module removes its hooks on the way out. Meanwhile another call, on
another thread, may copy the model (``precision.twin``, the cast copy a precision runs): the
copy would carry the hooks and keep them, firing into a call that has ended. So the engine
registers its hooks here, under one lock, and a copy made under the same lock drops them
(``held_while``, ``strip``); the caller's own hooks stay.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

_LOCK = threading.Lock()
_HELD: set[int] = set()  # ids of the engine's hooks on some module now

#: a module's hook tables, keyed by hook id (torch's names)
TABLES = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


class Held:
    """An engine hook: ``remove`` it as torch's handle."""

    __slots__ = ("handle",)

    def __init__(self, handle: RemovableHandle) -> None:
        self.handle = handle

    def remove(self) -> None:
        with _LOCK:
            self.handle.remove()
            _HELD.discard(self.handle.id)


def hold(register: Callable[..., RemovableHandle], *args: Any, **kwargs: Any) -> Held:
    """``register(*args, **kwargs)`` (a module's ``register_forward_hook`` or the like),
    the hook known as the engine's until removed."""
    with _LOCK:
        handle = register(*args, **kwargs)
        _HELD.add(handle.id)
    return Held(handle)


@contextmanager
def held_while() -> Iterator[frozenset[int]]:
    """No engine hook comes or goes in this block; the ids of those on modules now."""
    with _LOCK:
        yield frozenset(_HELD)


def strip(model: nn.Module, held: frozenset[int]) -> None:
    """Take the engine's hooks ``held`` out of ``model`` (a copy made in ``held_while``)."""
    for m in model.modules():
        for name in TABLES:
            table = getattr(m, name, None)
            if isinstance(table, dict):
                for key in [k for k in table if k in held]:
                    del table[key]
