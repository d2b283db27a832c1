"""The files ``attrserve attribute`` reads and writes: their suffixes, the per-example target
entry, a file's errors, and pyarrow (for .parquet) when it is installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.core.errors import InvalidRequest

#: what ``--inputs`` and ``--output`` may be
INPUT_SUFFIXES = (".npy", ".npz", ".pt", ".parquet", ".jsonl")
OUTPUT_SUFFIXES = (".npz", ".parquet")
#: an entry (npz key, .pt dict key, parquet column) by this name holds per-example targets
TARGET = "target"


def _bad(path: str | Path, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}")


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _bad(path, "parquet files need pyarrow: pip install 'attrserve[parquet]'") from None
    return pq
