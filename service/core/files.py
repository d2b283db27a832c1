"""Files written whole or not at all: the one atomic write every store uses (jobs, influence
indexes, concept sets and their caches, uploads, the offline command's outputs)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, data: bytes | Callable[[BinaryIO], object]) -> None:
    """``data`` (bytes, or a function writing to a binary file) at ``path``: written to a
    temporary file beside it (a dot file, never what a reader lists), flushed to disk, then
    renamed over it, so a reader (or a restart after a crash) sees the old file or the new
    one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if isinstance(data, bytes):
                f.write(data)
            else:
                data(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
