"""``attrserve attribute``: the engine over a file of examples, in this process, resumable.

Each chunk of examples goes through the HTTP route's own checks (``build_job``, with the
server's limits) and its own engine call (``run_job``), so a file gives the numbers, errors and
limits a request would. The pieces, kept stable for other runners (Ray Data calls them too):

    examples = read_examples("x.parquet", spec)          # .npy .npz .pt .parquet .jsonl
    request = {"method": "saliency", "target": 0}        # the request's fields but inputs
    check_batch(settings, spec, request, examples.slice(0, 64))   # refusals, no model needed
    columns = attribute_batch(lm, spec, request, examples.slice(0, 64), settings)
    write_output("attr.npz", [columns, ...])             # .npz or .parquet, by suffix

A column is an array with one row per example (``outputs``, ``target``, tensor attributions)
or, for raw texts, a list with one item per example: ``tokens`` and the per-token scores
(their lengths differ from text to text). ``request_from_args``, ``parse_target`` and
``describe`` turn the command's options into a request and a ServiceError into its message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from model_registry.spec import LoadedModel, ModelSpec
from service.core.errors import (
    AttributionFailed,
    InvalidRequest,
    LimitExceeded,
    ServiceError,
    UnknownModel,
    from_engine,
)
from service.core.settings import Settings
from service.wire import codec

#: what ``--inputs`` and ``--output`` may be
INPUT_SUFFIXES = (".npy", ".npz", ".pt", ".parquet", ".jsonl")
OUTPUT_SUFFIXES = (".npz", ".parquet")
#: examples per chunk when ``--batch-size`` is not given (fewer where the cost limit says so)
DEFAULT_BATCH_SIZE = 64
#: an entry (npz key, .pt dict key, parquet column) by this name holds per-example targets
TARGET = "target"
PROG = "attrserve attribute"
#: a cap that never binds while reading: each chunk is checked against the real one
_NO_CAP = 1 << 62


# ---------------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Examples:
    """Examples read from a file: arrays by model input name (dim 0 the examples) or raw
    texts, and optional per-example targets (None items: the command's ``--target``)."""

    arrays: dict[str, np.ndarray] | None
    texts: list[str] | None
    targets: list[Any] | None
    n: int

    def slice(self, start: int, stop: int) -> Examples:
        """Examples ``start`` to ``stop`` (views, no copies)."""
        stop = min(stop, self.n)
        return Examples(
            arrays=None
            if self.arrays is None
            else {k: a[start:stop] for k, a in self.arrays.items()},
            texts=None if self.texts is None else self.texts[start:stop],
            targets=None if self.targets is None else self.targets[start:stop],
            n=max(0, stop - start),
        )


def _bad(path: str | Path, message: str) -> InvalidRequest:
    return InvalidRequest(f"{path}: {message}")


def read_examples(path: str | Path, spec: ModelSpec) -> Examples:
    """The examples in ``path`` for ``spec``'s inputs; a ServiceError that names the file (and
    line) when it cannot be read as such. Shapes and dtypes are checked per chunk, as the HTTP
    API checks them.

    ``.npy``: one array, dim 0 the examples (strings: raw texts). ``.npz``: arrays keyed by
    input name, or a single array. ``.pt``: a tensor, a tuple/list of tensors (in input order)
    or a dict by input name (read with ``weights_only=True``). ``.parquet``: one column per
    input, each cell one example's numbers (nested or flat lists), or a string column of raw
    texts. ``.jsonl``: one ``{"inputs": ..., "target": ...}`` object per line, ``inputs`` one
    example in any of the HTTP API's forms. ``.npz``, ``.pt`` dicts and ``.parquet`` may add a
    ``target`` entry with one target per example.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in INPUT_SUFFIXES:
        raise _bad(p, f"unknown input format {suffix or '(none)'!r}; use one of {INPUT_SUFFIXES}")
    if not p.is_file():
        raise _bad(p, "no such file")
    reader = {
        ".npy": _read_npy,
        ".npz": _read_npz,
        ".pt": _read_pt,
        ".parquet": _read_parquet,
        ".jsonl": _read_jsonl,
    }[suffix]
    examples = reader(p, spec)
    if examples.n == 0:
        raise _bad(p, "holds no examples")
    return examples


def _numbers(a: np.ndarray, path: Path, name: str) -> np.ndarray:
    if a.dtype.kind not in "biuf":
        raise _bad(path, f"{name} holds {a.dtype} values; inputs must be numbers")
    if a.ndim == 0:
        raise _bad(path, f"{name} is a single number; dim 0 must be the examples")
    return a if a.flags.writeable else a.copy()  # torch warns on read-only arrays (arrow's)


def _by_name(entries: dict[str, Any], spec: ModelSpec, path: Path) -> dict[str, Any]:
    """Entries for the model's inputs: by name, or the one entry of a one-input model."""
    names = [i.name for i in spec.inputs]
    if all(n in entries for n in names):
        return {n: entries[n] for n in names}
    if len(names) == 1 and len(entries) == 1:
        return {names[0]: next(iter(entries.values()))}
    missing = [n for n in names if n not in entries]
    raise _bad(
        path,
        f"holds {sorted(entries)}; model {spec.id!r} takes the inputs {names} (missing: {missing})",
    )


def _file_targets(value: Any) -> list[Any]:
    """Per-example targets from an array or column: ints, labels, index rows, None."""
    items = value.tolist() if isinstance(value, np.ndarray) else list(value)
    return [{"index": t} if isinstance(t, list) else t for t in items]


def _split_targets(entries: dict[str, Any], spec: ModelSpec) -> tuple[dict[str, Any], Any]:
    if TARGET in entries and TARGET not in {i.name for i in spec.inputs}:
        rest = {k: v for k, v in entries.items() if k != TARGET}
        return rest, entries[TARGET]
    return entries, None


def _from_entries(entries: dict[str, Any], spec: ModelSpec, path: Path) -> Examples:
    """Examples from arrays (or a text list) keyed by name, plus an optional target entry."""
    entries, raw_targets = _split_targets(entries, spec)
    chosen = _by_name(entries, spec, path)
    first = next(iter(chosen.values()))
    if len(chosen) == 1 and (
        (isinstance(first, list) and all(isinstance(v, str) for v in first))
        or (isinstance(first, np.ndarray) and first.dtype.kind in "US")
    ):
        examples = Examples(arrays=None, texts=[str(t) for t in first], targets=None, n=len(first))
    else:
        arrays = {k: _numbers(np.asarray(v), path, k) for k, v in chosen.items()}
        sizes = {k: int(a.shape[0]) for k, a in arrays.items()}
        if len(set(sizes.values())) > 1:
            raise _bad(path, f"every input needs the same number of examples, got {sizes}")
        examples = Examples(arrays=arrays, texts=None, targets=None, n=next(iter(sizes.values())))
    if raw_targets is not None:
        targets = _file_targets(raw_targets)
        if len(targets) != examples.n:
            raise _bad(path, f"{TARGET} has {len(targets)} entries for {examples.n} examples")
        examples = Examples(examples.arrays, examples.texts, targets, examples.n)
    return examples


def _read_npy(path: Path, spec: ModelSpec) -> Examples:
    try:
        a = np.load(path, allow_pickle=False)
    except ValueError as exc:
        raise _bad(path, f"not a plain .npy array ({exc})") from None
    if len(spec.inputs) > 1:
        raise _bad(path, f"model {spec.id!r} takes {len(spec.inputs)} inputs: use .npz or .pt")
    return _from_entries({spec.inputs[0].name: a}, spec, path)


def _read_npz(path: Path, spec: ModelSpec) -> Examples:
    try:
        with np.load(path, allow_pickle=False) as z:
            entries: dict[str, Any] = {k: z[k] for k in z.files}
    except ValueError as exc:
        raise _bad(path, f"not a plain .npz of arrays ({exc})") from None
    return _from_entries(entries, spec, path)


def _read_pt(path: Path, spec: ModelSpec) -> Examples:
    import torch

    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # weights_only refuses pickled objects with its own error types
        raise _bad(path, f"cannot be read with torch.load(weights_only=True): {exc}") from None

    def arr(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            v = v.detach()
            return (v.float() if v.dtype == torch.bfloat16 else v).numpy()
        return v

    names = [i.name for i in spec.inputs]
    if isinstance(obj, dict):
        entries = {str(k): arr(v) for k, v in obj.items()}
    elif isinstance(obj, (tuple, list)) and obj and all(isinstance(v, str) for v in obj):
        entries = {names[0]: list(obj)}
    elif isinstance(obj, (tuple, list)):
        if len(obj) != len(names):
            raise _bad(path, f"holds {len(obj)} tensors; model {spec.id!r} takes {names}")
        entries = {n: arr(v) for n, v in zip(names, obj, strict=True)}
    elif isinstance(obj, torch.Tensor):
        entries = {names[0]: arr(obj)}
    else:
        raise _bad(path, f"holds a {type(obj).__name__}; save a tensor, tensors or a dict")
    for k, v in entries.items():
        if not isinstance(v, (np.ndarray, list)) and k != TARGET:
            raise _bad(path, f"{k} is a {type(v).__name__}, not a tensor")
    return _from_entries(entries, spec, path)


def _read_parquet(path: Path, spec: ModelSpec) -> Examples:
    pq = _pyarrow(path)
    table = pq.read_table(path)
    columns = set(table.column_names)
    entries: dict[str, Any] = {}
    names = [i.name for i in spec.inputs]
    chosen = [n for n in names if n in columns]
    if len(chosen) < len(names) and len(names) == 1:
        others = [c for c in table.column_names if c != TARGET]
        chosen = ["text"] if "text" in columns else others[:1] if len(others) == 1 else []
    if len(chosen) != len(names):
        raise _bad(path, f"has the columns {table.column_names}; model {spec.id!r} takes {names}")
    for name, column in zip(names, chosen, strict=True):
        entries[name] = _parquet_column(table.column(column), column, spec, name, path)
    if TARGET in columns and TARGET not in names:
        entries[TARGET] = table.column(TARGET).to_pylist()
    return _from_entries(entries, spec, path)


def _pyarrow(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _bad(path, "parquet files need pyarrow: pip install 'attrserve[parquet]'") from None
    return pq


def _parquet_column(col: Any, column: str, spec: ModelSpec, name: str, path: Path) -> Any:
    """A column as one array (cells of equal shape stacked) or a list of texts."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col.combine_chunks()
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        if arr.null_count:
            raise _bad(path, f"column {column!r} holds nulls")
        return arr.to_pylist()
    shape = [len(arr)]
    lists = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
    while any(is_list(arr.type) for is_list in lists):
        if arr.null_count:
            raise _bad(path, f"column {column!r} holds nulls")
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
        else:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            if len(lengths) and bool((lengths != lengths[0]).any()):
                raise _bad(
                    path, f"column {column!r}: cells of different lengths (dim {len(shape)})"
                )
            size = int(lengths[0]) if len(lengths) else 0
        shape.append(size)
        arr = arr.flatten()
    if arr.null_count:
        raise _bad(path, f"column {column!r} holds nulls")
    values = np.asarray(arr.to_numpy(zero_copy_only=False)).reshape(shape)
    want = next(i.shape for i in spec.inputs if i.name == name)
    # images are usually stored flat: one list per cell, reshaped to the declared shape
    dims = [d for d in want[1:] if d is not None]
    if values.ndim == 2 < len(want) == len(dims) + 1 and math.prod(dims) == values.shape[1]:
        values = values.reshape(values.shape[0], *dims)
    return values


def _read_jsonl(path: Path, spec: ModelSpec) -> Examples:
    names = [i.name for i in spec.inputs]
    texts: list[str] = []
    rows: list[list[np.ndarray]] = []
    targets: list[Any] = []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InvalidRequest(f"{where}: not JSON ({exc})") from None
            if not isinstance(obj, dict) or "inputs" not in obj:
                raise InvalidRequest(f'{where}: a line is {{"inputs": ..., "target": ...}}')
            unknown = sorted(set(obj) - {"inputs", "target"})
            if unknown:
                raise InvalidRequest(f"{where}: unknown keys {unknown} (inputs, target)")
            raw = obj["inputs"]
            if isinstance(raw, str) != bool(texts) and (texts or rows):
                raise InvalidRequest(f"{where}: texts and tensors mixed in one file")
            if isinstance(raw, str):
                texts.append(raw)
            else:
                rows.append(_example(raw, spec, where))
                if len(rows) > 1:
                    _same_shapes(rows[0], rows[-1], names, where)
            targets.append(obj.get("target"))
    if texts:
        return Examples(arrays=None, texts=texts, targets=targets, n=len(texts))
    arrays = {
        n: np.stack([r[i] for r in rows]) if rows else np.zeros(0) for i, n in enumerate(names)
    }
    return Examples(arrays=arrays, texts=None, targets=targets, n=len(rows))


def _example(raw: Any, spec: ModelSpec, where: str) -> list[np.ndarray]:
    """One example's tensors (no batch dim), in input order, from an HTTP inputs form."""
    names = [i.name for i in spec.inputs]
    if isinstance(raw, dict) and not codec.is_tensor_object(raw):
        if set(raw) != set(names):
            raise InvalidRequest(f"{where}: inputs by name must give exactly {names}")
        parts = [raw[n] for n in names]
    elif len(names) > 1:
        if not isinstance(raw, list) or len(raw) != len(names):
            raise InvalidRequest(f"{where}: model {spec.id!r} takes {len(names)} inputs {names}")
        parts = list(raw)
    else:
        parts = [raw]
    out = []
    for part, ispec in zip(parts, spec.inputs, strict=True):
        try:
            out.append(codec.decode_tensor(part, ("body", "inputs"), _NO_CAP, ispec.dtype))
        except ServiceError as err:
            raise InvalidRequest(f"{where}: {err.detail}") from None
    return out


def _same_shapes(
    first: list[np.ndarray], row: list[np.ndarray], names: list[str], where: str
) -> None:
    for name, a, b in zip(names, first, row, strict=True):
        if a.shape != b.shape:
            raise InvalidRequest(
                f"{where}: inputs {name!r} has shape {list(b.shape)}; the first line's has "
                f"{list(a.shape)} (every example must have the same shape)"
            )


# ------------------------------------------------------------------------------ one chunk


def chunk_target(examples: Examples, default: Any) -> Any:
    """The request target for these examples: ``default``, or one per example where the file
    gives some (items without one take ``default``)."""
    if examples.targets is None or all(t is None for t in examples.targets):
        return default
    if default == "predicted" and any(t is None for t in examples.targets):
        raise InvalidRequest(
            'target "predicted" cannot fill in for examples without one while others have '
            "their own: give every example a target, or none",
            loc=("body", "target"),
        )
    items = [default if t is None else t for t in examples.targets]
    if all(t == items[0] for t in items):
        return items[0]
    return items


def _request(request: dict[str, Any], examples: Examples) -> Any:
    from service.serving.kserve import validated
    from service.wire.attributions import AttributionRequest

    body = dict(request)
    if examples.texts is not None:
        body["inputs"] = list(examples.texts)
    else:
        if examples.arrays is None:  # read_examples gives arrays or texts; say so if neither
            raise InvalidRequest("the input file holds no examples", loc=("body", "inputs"))
        arrays = examples.arrays
        # one input: the bare array, so shape errors read as for a nested list on the wire
        body["inputs"] = next(iter(arrays.values())) if len(arrays) == 1 else dict(arrays)
    body["target"] = chunk_target(examples, request.get("target"))
    return validated(AttributionRequest, body, ("body",))


def check_batch(
    settings: Settings, spec: ModelSpec, request: dict[str, Any], examples: Examples
) -> Any:
    """The chunk as the HTTP route's ``Job``: every check ``attribute_batch`` makes, without
    the model (a ServiceError for what the route would refuse)."""
    from service.serving.attributions import build_job

    return build_job(settings, spec, _request(request, examples), math.inf)


def _run(lm: LoadedModel, job: Any) -> Any:
    """``run_job``, its failures as the worker reports them."""
    from methods.errors import AttributionError, ModelError
    from service.worker.compute import run_job

    try:
        return run_job(lm, job)
    except ModelError as exc:
        # a person runs this: the model's own message helps more than a log reference
        raise AttributionFailed(str(exc), loc=("body", "inputs")) from None
    except AttributionError as exc:
        raise from_engine(exc) from None


def attribute_batch(
    lm: LoadedModel,
    spec: ModelSpec,
    request: dict[str, Any],
    examples: Examples,
    settings: Settings,
) -> dict[str, np.ndarray | list[Any]]:
    """One chunk through the HTTP route's checks and engine call: the columns to write.

    ``request`` holds the attributions request's fields but ``inputs`` (``method``,
    ``target``, ``params``, ``baselines``, ...); its ``target`` is the default for examples
    without their own in ``examples.targets``. Raises the ServiceError the route would answer.

    Columns: ``attributions`` (``attributions_<input>`` per input where the attributions
    mirror several inputs), ``outputs``, ``convergence_delta`` and ``target`` where present,
    and for raw texts ``tokens``; texts' columns are lists (one item per example), per-token
    scores cut to each text's tokens.
    """
    import methods.registry

    job = check_batch(settings, spec, request, examples)
    reply = _run(lm, job)
    parts: list[np.ndarray] = reply.attributions
    if reply.as_tuple:
        names = [i.name for i in spec.inputs]
        keys = [f"attributions_{names[i] if i < len(names) else i}" for i in range(len(parts))]
    else:
        keys = ["attributions"]
    cols: dict[str, np.ndarray | list[Any]] = {}
    if reply.tokens is not None:
        tokens = reply.tokens
        per_token = job.attributed_layer is not None or (
            methods.registry.get(job.method).kind == "perturbation"
        )
        for key, part in zip(keys, parts, strict=True):
            rows = [part[i, : len(t)] if per_token else part[i] for i, t in enumerate(tokens)]
            cols[key] = [np.ascontiguousarray(r) for r in rows]
    else:
        cols.update(zip(keys, parts, strict=True))
    if reply.outputs is not None:
        cols["outputs"] = reply.outputs
    if reply.delta is not None:
        cols["convergence_delta"] = reply.delta
    if reply.target is not None:
        cols["target"] = np.asarray(reply.target)
    if reply.tokens is not None:
        cols["tokens"] = [list(t) for t in reply.tokens]
    return cols


# ---------------------------------------------------------------------------------- output


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


def _atomic(path: Path, write: Any) -> None:
    """``write(file)`` to a temporary file beside ``path``, then renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
        _atomic(p, lambda f: _savez(f, arrays))
    else:
        table = _table(p, columns)
        pq = _pyarrow(p)
        _atomic(p, lambda f: pq.write_table(table, f))


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


# ---------------------------------------------------------------------- resumable progress


def _encode_chunk(cols: dict[str, Any]) -> dict[str, np.ndarray]:
    """A chunk's columns as plain arrays (no pickles): ragged items padded, their shapes kept."""
    out: dict[str, np.ndarray] = {}
    for k, v in cols.items():
        if isinstance(v, np.ndarray):
            out[k] = v
        elif _is_tokens(v):
            out[k] = _pad_tokens(v)
            out[f"{k}@lengths"] = np.array([len(t) for t in v], dtype=np.int64)
        else:
            out[k] = _pad(v)
            out[f"{k}@shapes"] = np.array([a.shape for a in v], dtype=np.int64).reshape(len(v), -1)
    return out


def _decode_chunk(z: dict[str, np.ndarray]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in z.items():
        if "@" in k:
            continue
        if f"{k}@lengths" in z:
            out[k] = [list(row[:n]) for row, n in zip(v.tolist(), z[f"{k}@lengths"], strict=True)]
        elif f"{k}@shapes" in z:
            shapes = z[f"{k}@shapes"]
            out[k] = [
                np.ascontiguousarray(row[tuple(slice(0, int(s)) for s in shape)])
                for row, shape in zip(v, shapes, strict=True)
            ]
        else:
            out[k] = v
    return out


class Progress:
    """Finished chunks in ``<output>.partial/``: ``state.json`` and one ``.npz`` per chunk,
    each written atomically, so an interrupted run continues after its last finished chunk."""

    def __init__(self, output: Path, fingerprint: dict[str, Any]) -> None:
        self.dir = output.with_name(output.name + ".partial")
        self.fingerprint = fingerprint
        self.done = 0
        self.stale = False  # an earlier run's state to clear before the first new chunk

    def open(self) -> str | None:
        """Look for an earlier run; what to tell the user about it (None: nothing there)."""
        state_file = self.dir / "state.json"
        if not self.dir.exists():
            return None
        self.stale = True
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return f"starting over: {self.dir}/ holds no readable state"
        for key, what in (
            ("input", "the input file changed"),
            ("options_sha256", "the options differ"),
            ("chunk_size", "--batch-size differs"),
        ):
            if state.get(key) != self.fingerprint[key]:
                return f"starting over: {what} since the interrupted run"
        done = 0
        while done < int(state.get("chunks_done", 0)) and self._chunk(done).is_file():
            done += 1
        if not done:
            return None
        self.done, self.stale = done, False
        size, total = self.fingerprint["chunk_size"], self.fingerprint["examples"]
        chunks = self.fingerprint["chunks"]
        return (
            f"resuming the interrupted run: {done} of {chunks} chunks "
            f"({min(done * size, total)} of {total} examples) already done"
        )

    def _chunk(self, k: int) -> Path:
        return self.dir / f"chunk-{k:06d}.npz"

    def save(self, k: int, cols: dict[str, Any]) -> None:
        if self.stale:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.stale = False
        arrays = _encode_chunk(cols)
        _atomic(self._chunk(k), lambda f: _savez(f, arrays))
        self.done = k + 1
        state = {"version": 1, **self.fingerprint, "chunks_done": self.done}
        text = json.dumps(state, indent=1).encode()
        _atomic(self.dir / "state.json", lambda f: f.write(text))

    def chunks(self) -> Iterator[dict[str, Any]]:
        for k in range(self.done):
            with np.load(self._chunk(k), allow_pickle=False) as z:
                yield _decode_chunk({name: z[name] for name in z.files})

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------- command


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _where(err: ServiceError) -> str:
    if not err.errors:
        return ""
    loc = [str(p) for p in err.errors[0].get("loc", [])]
    loc = loc[1:] if loc[:1] == ["body"] else loc
    return ".".join(loc)


def describe(err: ServiceError, examples: tuple[int, int] | None = None) -> str:
    """An error for a person: the HTTP API's detail, where, and which examples."""
    at = [f"at {w}"] if (w := _where(err)) else []
    if examples is not None:
        at.append(f"examples {examples[0]}..{examples[1] - 1}")
    return err.detail + (f" ({', '.join(at)})" if at else "")


def _json_option(name: str, text: str | None, kind: type | None = None) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"{name} is not valid JSON: {exc}") from None
    if kind is not None and not isinstance(value, kind):
        raise InvalidRequest(f"{name} must be a JSON {kind.__name__}, got {text!r}")
    return value


def parse_target(text: str | None) -> Any:
    """``--target``: JSON when it parses (3, [1, 0], {"index": [2]}, null), else a label."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The attributions request's fields (all but ``inputs`` and ``baselines``) from the
    command's options; a ``--target`` list (one per example of the file) is left to the
    examples, so ``target`` is then None. InvalidRequest for options that do not parse."""
    target = parse_target(args.target)
    return {
        "method": args.method,
        "target": None if isinstance(target, list) else target,
        "params": _json_option("--params", args.params, dict) or {},
        "noise_tunnel": _json_option("--noise-tunnel", args.noise_tunnel, dict),
        "internal_batch_size": _batch_knob("--internal-batch-size", args.internal_batch_size),
        "perturbations_per_eval": _batch_knob(
            "--perturbations-per-eval", args.perturbations_per_eval
        ),
        "seed": args.seed,
        "return_convergence_delta": args.convergence_delta,
    }


def _batch_knob(name: str, text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be an int or 'auto', got {text!r}") from None


def _file_id(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _baselines(args: argparse.Namespace, spec: ModelSpec) -> tuple[Any, Any]:
    """``--baselines``: a number, or a file read as the inputs are; and its fingerprint."""
    text = args.baselines
    if text is None:
        return None, None
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number, number
    b = read_examples(text, spec)
    if b.arrays is None:
        raise InvalidRequest(f"{text}: baselines must be tensors, not texts")
    arrays = [b.arrays[i.name] for i in spec.inputs]
    return (arrays[0] if len(arrays) == 1 else arrays), _file_id(Path(text))


def _per_example(baselines: Any, n: int, spec: ModelSpec, request: dict[str, Any]) -> bool:
    """Whether file baselines give one row per example (sliced with the chunks) rather than
    one to broadcast or a distribution the method samples (passed whole to every chunk)."""
    from service.serving import support

    if n <= 1 or baselines is None or isinstance(baselines, float):
        return False
    first = baselines if isinstance(baselines, np.ndarray) else baselines[0]
    if first.ndim != len(spec.inputs[0].shape) or first.shape[0] != n:
        return False
    ms = support.plan(spec, request["method"], request.get("params") or {}).method
    return ms.merge != "shared_baselines"


def _spec(models: str | None, model_id: str) -> ModelSpec:
    import model_registry

    try:
        specs = {s.id: s for s in model_registry.load_specs(models)}
    except model_registry.RegistryError as exc:
        raise InvalidRequest(str(exc)) from None
    if model_id not in specs:
        raise UnknownModel(f"unknown model {model_id!r}; the models are {sorted(specs)}")
    return specs[model_id]


def _cut(request: dict[str, Any], baselines: Any, start: int, stop: int) -> dict[str, Any]:
    """The request for examples ``start`` to ``stop``: per-example baselines cut to them."""
    if baselines is None:
        return request
    b = baselines
    part = b[start:stop] if isinstance(b, np.ndarray) else [x[start:stop] for x in b]
    return {**request, "baselines": part}


@dataclass
class RunPlan:
    spec: ModelSpec
    settings: Settings
    request: dict[str, Any]
    examples: Examples
    baselines: Any  # per-example baselines, cut with the chunks; else None
    chunk: int
    progress: Progress

    def request_for(self, start: int, stop: int) -> dict[str, Any]:
        return _cut(self.request, self.baselines, start, stop)


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Everything checked before any work: the model, the request, the file, the first chunk."""
    settings = Settings.from_env(models=args.models)
    output = Path(args.output)
    if output.suffix.lower() not in OUTPUT_SUFFIXES:
        raise _bad(output, f"unknown output format; use one of {OUTPUT_SUFFIXES}")
    if output.suffix.lower() == ".parquet":
        _pyarrow(output)
    spec = _spec(settings.models, args.model)
    request = request_from_args(args)
    target = parse_target(args.target)
    baselines, baselines_id = _baselines(args, spec)
    examples = read_examples(args.inputs, spec)
    if isinstance(target, list):  # one per example of the whole file: it goes with the rows
        if len(target) != examples.n:
            raise InvalidRequest(
                f"target has {len(target)} entries; give one per example ({examples.n})",
                loc=("body", "target"),
            )
        own = examples.targets or [None] * examples.n
        targets = [t if t is not None else d for t, d in zip(own, target, strict=True)]
        examples = Examples(examples.arrays, examples.texts, targets, examples.n)
    chunk_target(examples, request["target"])  # a mix "predicted" cannot fill: refused now
    sliced = _per_example(baselines, examples.n, spec, request)
    if not sliced:
        request["baselines"] = baselines
    chunk = args.batch_size
    if chunk is not None and not 1 <= chunk <= settings.max_batch_size:
        raise LimitExceeded(
            f"--batch-size {chunk} must be 1..{settings.max_batch_size} (this server's "
            "examples per request, ATTRSERVE_MAX_BATCH_SIZE)"
        )
    per_row = baselines if sliced else None

    def first_chunk(size: int) -> None:  # fails here, before the model loads or the bar starts
        check_batch(settings, spec, _cut(request, per_row, 0, size), examples.slice(0, size))

    if chunk is not None:
        first_chunk(chunk)
    else:
        chunk = min(DEFAULT_BATCH_SIZE, settings.max_batch_size)
        try:
            first_chunk(chunk)
        except LimitExceeded:  # over the cost limit: as many examples as it allows
            one = check_batch(settings, spec, _cut(request, per_row, 0, 1), examples.slice(0, 1))
            chunk = max(1, min(chunk, settings.max_cost // max(1, one.cost)))
            first_chunk(chunk)
    options = {
        "model": spec.id,
        "version": spec.version,
        "models": None if settings.models is None else _file_id(Path(settings.models)),
        "request": {**request, "baselines": baselines_id},
        "targets": examples.targets,
    }
    digest = hashlib.sha256(orjson.dumps(options, option=orjson.OPT_SORT_KEYS)).hexdigest()
    progress = Progress(
        output,
        {
            "input": _file_id(Path(args.inputs)),
            "options_sha256": digest,
            "chunk_size": chunk,
            "examples": examples.n,
            "chunks": math.ceil(examples.n / chunk),
        },
    )
    return RunPlan(spec, settings, request, examples, per_row, chunk, progress)


def main(args: argparse.Namespace) -> int:
    """``attrserve attribute``: 0 done, 2 a request or file the HTTP API would refuse (said
    on stderr), 130 interrupted (progress kept; the same command resumes)."""
    try:
        plan = plan_run(args)
    except ServiceError as err:
        say(f"error: {describe(err)}")
        return 2
    except KeyboardInterrupt:
        say("interrupted before any work")
        return 130
    progress, n, size = plan.progress, plan.examples.n, plan.chunk
    total = math.ceil(n / size)
    note = progress.open()
    if note and not args.quiet:
        say(note)
    try:
        return _work(args, plan, total)
    except KeyboardInterrupt:
        if progress.done:
            say(
                f"interrupted after {progress.done} of {total} chunks; run the same command "
                f"again to resume (progress is kept in {progress.dir}/)"
            )
        else:
            say("interrupted before the first chunk finished; nothing was kept")
        return 130


def _work(args: argparse.Namespace, plan: RunPlan, total: int) -> int:
    from tqdm import tqdm

    import model_registry

    progress, n, size = plan.progress, plan.examples.n, plan.chunk
    try:
        lm = model_registry.load(plan.spec)
    except model_registry.RegistryError as exc:
        say(f"error: {exc}")
        return 2
    quiet = args.quiet or not sys.stderr.isatty()
    with tqdm(
        total=n,
        initial=min(progress.done * size, n),
        unit="ex",
        desc=f"{plan.spec.id} {plan.request['method']}",
        file=sys.stderr,
        disable=quiet,
        dynamic_ncols=True,
    ) as bar:
        for k in range(progress.done, total):
            start, stop = k * size, min(n, (k + 1) * size)
            try:
                cols = attribute_batch(
                    lm,
                    plan.spec,
                    plan.request_for(start, stop),
                    plan.examples.slice(start, stop),
                    plan.settings,
                )
            except ServiceError as err:
                bar.close()
                say(f"error: {describe(err, (start, stop) if total > 1 else None)}")
                if progress.done:
                    say(f"{progress.done} finished chunks are kept in {progress.dir}/")
                return 2
            progress.save(k, cols)
            bar.update(stop - start)
    write_output(args.output, list(progress.chunks()))
    progress.remove()
    if not args.quiet:
        say(f"wrote {n} examples to {args.output}")
    return 0
