"""Writing the chunks' columns: ``.npz`` or ``.parquet``, atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from service.cli.offline.formats import OUTPUT_SUFFIXES, _bad, _pyarrow
from service.core.files import atomic_write


def _is_tokens(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(t, list) for t in items)


def _pad(items: list[np.ndarray]) -> np.ndarray:
    """Per-example arrays of differing shapes as one array, zero-padded to the largest."""
    if not items:
        return np.zeros(0, dtype=np.float32)
    ndim = max(a.ndim for a in items)
    shape = [max(a.shape[d] if d < a.ndim else 1 for a in items) for d in range(ndim)]
    out = np.zeros((len(items), *shape), dtype=np.result_type(*items))
    for i, a in enumerate(items):
        out[i][tuple(slice(0, s) for s in a.shape)] = a
    return out


def _pad_tokens(items: list[list[str]]) -> np.ndarray:
    width = max([0, *(len(t) for t in items)])
    return np.array([[*t, *[""] * (width - len(t))] for t in items], dtype=str).reshape(
        len(items), width
    )


def _rows(chunk: dict[str, Any]) -> int:
    if "outputs" in chunk:
        return len(chunk["outputs"])
    return len(next(iter(chunk.values())))


def _joined(columns: list[dict[str, Any]]) -> dict[str, Any]:
    """Chunks' columns concatenated: arrays by rows, lists by items (order kept)."""
    keys = list(columns[0])
    for c in columns[1:]:
        if list(c) != keys:
            raise ValueError(f"chunks disagree on their columns: {keys} and {list(c)}")
    out: dict[str, Any] = {}
    for k in keys:
        values = [c[k] for c in columns]
        if all(isinstance(v, np.ndarray) for v in values):
            shapes = {v.shape[1:] for v in values}
            out[k] = (
                np.concatenate(values) if len(shapes) == 1 else _pad([r for v in values for r in v])
            )
        else:
            out[k] = [item for v in values for item in v]
    return out


def _savez(f: Any, arrays: dict[str, np.ndarray]) -> None:
    save: Any = np.savez  # its stubs read ** as allow_pickle
    save(f, **arrays)


def write_output(path: str | Path, columns: list[dict[str, Any]]) -> None:
    """The chunks' columns concatenated into ``path`` (written atomically), by its suffix:

    ``.npz``: one array per column; texts' per-token scores zero-padded to the longest text,
    and ``tokens`` a string array padded with "". ``.parquet``: one row per example, a column
    per column (tensors as nested lists, per-token scores as long as each text's tokens,
    per-sample deltas as a list per example).
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in OUTPUT_SUFFIXES:
        raise _bad(p, f"unknown output format {suffix or '(none)'!r}; use one of {OUTPUT_SUFFIXES}")
    if not columns:
        raise ValueError("no chunks to write")
    if suffix == ".npz":
        joined = _joined(columns)
        arrays = {
            k: v if isinstance(v, np.ndarray) else (_pad_tokens(v) if _is_tokens(v) else _pad(v))
            for k, v in joined.items()
        }
        atomic_write(p, lambda f: _savez(f, arrays))
    else:
        table = _table(p, columns)
        pq = _pyarrow(p)
        atomic_write(p, lambda f: pq.write_table(table, f))


def _table(path: Path, columns: list[dict[str, Any]]) -> Any:
    import pyarrow as pa

    _pyarrow(path)
    per_example: list[dict[str, Any]] = []
    for chunk in columns:  # deltas with k rows per example: [n, k] per chunk first
        n = _rows(chunk)
        fixed = {}
        for k, v in chunk.items():
            if isinstance(v, np.ndarray) and v.ndim >= 1 and len(v) != n and n and len(v) % n == 0:
                v = v.reshape(n, len(v) // n, *v.shape[1:])
            fixed[k] = v
        per_example.append(fixed)
    joined = _joined(per_example)
    arrays = {}
    for k, v in joined.items():
        if isinstance(v, np.ndarray):
            arrays[k] = _arrow_array(v)
        elif _is_tokens(v):
            arrays[k] = pa.array(v, type=pa.list_(pa.string()))
        else:
            arrays[k] = pa.array([a.tolist() for a in v], type=_list_type(v))
    return pa.table(arrays)


def _list_type(items: list[np.ndarray]) -> Any:
    import pyarrow as pa

    t = pa.from_numpy_dtype(np.result_type(*items)) if items else pa.float32()
    for _ in range(max([1, *(a.ndim for a in items)])):
        t = pa.list_(t)
    return t


def _arrow_array(a: np.ndarray) -> Any:
    """Rows of ``a`` as nested fixed-size lists (scalars as they are), without Python lists."""
    import pyarrow as pa

    values = pa.array(np.ascontiguousarray(a).reshape(-1))
    for size in reversed(a.shape[1:]):
        values = pa.FixedSizeListArray.from_arrays(values, size)
    return values
