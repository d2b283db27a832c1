"""Reading the examples of a file: ``.npy``, ``.npz``, ``.pt``, ``.parquet``, ``.jsonl``."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from model_registry.spec import ModelSpec
from service.cli.offline.engine import codec, images
from service.cli.offline.formats import INPUT_SUFFIXES, TARGET, _bad, _pyarrow
from service.core.errors import InvalidRequest, ServiceError

#: a folder's files that are read as images
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
#: a cap that never binds while reading: each chunk is checked against the real one
_NO_CAP = 1 << 62


@dataclass(frozen=True)
class Examples:
    """Examples read from a file: arrays by model input name (dim 0 the examples) or raw
    texts or images, and optional per-example targets (None items: the command's
    ``--target``)."""

    arrays: dict[str, np.ndarray] | None
    #: texts, pairs of texts as two-item lists, or encoded images (``{"image": "<base64>"}``):
    #: each example in its HTTP form
    raw: list[Any] | None
    targets: list[Any] | None
    n: int
    #: a folder of images: each example's file name
    files: list[str] | None = None

    def slice(self, start: int, stop: int) -> Examples:
        """Examples ``start`` to ``stop`` (views, no copies)."""
        stop = min(stop, self.n)
        return Examples(
            arrays=None
            if self.arrays is None
            else {k: a[start:stop] for k, a in self.arrays.items()},
            raw=None if self.raw is None else self.raw[start:stop],
            targets=None if self.targets is None else self.targets[start:stop],
            n=max(0, stop - start),
            files=None if self.files is None else self.files[start:stop],
        )


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
    if p.is_dir():
        return _read_images(p, spec)
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


def _read_images(folder: Path, spec: ModelSpec) -> Examples:
    """A folder's image files, in name order, as encoded images (their file names kept)."""
    if spec.images is None:
        raise _bad(folder, f"is a folder; model {spec.id!r} takes no images (give a file)")
    files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise _bad(folder, f"holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    raw = [{"image": base64.b64encode(f.read_bytes()).decode("ascii")} for f in files]
    return Examples(arrays=None, raw=raw, targets=None, n=len(raw), files=[f.name for f in files])


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
        examples = Examples(arrays=None, raw=[str(t) for t in first], targets=None, n=len(first))
    else:
        arrays = {k: _numbers(np.asarray(v), path, k) for k, v in chosen.items()}
        sizes = {k: int(a.shape[0]) for k, a in arrays.items()}
        if len(set(sizes.values())) > 1:
            raise _bad(path, f"every input needs the same number of examples, got {sizes}")
        examples = Examples(arrays=arrays, raw=None, targets=None, n=next(iter(sizes.values())))
    if raw_targets is not None:
        targets = _file_targets(raw_targets)
        if len(targets) != examples.n:
            raise _bad(path, f"{TARGET} has {len(targets)} entries for {examples.n} examples")
        examples = replace(examples, targets=targets)
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
    texts: list[Any] = []  # texts, text pairs as two-item lists, or images (HTTP forms)
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
            # a text, a pair of texts, or an encoded image: passed on as the HTTP form
            text = codec.is_text(raw) or images.is_image(raw)
            if text != bool(texts) and (texts or rows):
                raise InvalidRequest(f"{where}: texts or images and tensors mixed in one file")
            if text:
                texts.append(raw)
            else:
                rows.append(_example(raw, spec, where))
                if len(rows) > 1:
                    _same_shapes(rows[0], rows[-1], names, where)
            targets.append(obj.get("target"))
    if texts:
        return Examples(arrays=None, raw=texts, targets=targets, n=len(texts))
    arrays = {
        n: np.stack([r[i] for r in rows]) if rows else np.zeros(0) for i, n in enumerate(names)
    }
    return Examples(arrays=arrays, raw=None, targets=targets, n=len(rows))


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
