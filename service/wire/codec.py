"""The one tensor codec: JSON <-> arrays, and every shape, dtype and size check on the wire.

A tensor on the wire is a nested JSON list, or ``{"dtype", "shape", "b64"}`` (raw little-endian
C-order bytes, base64). Arrays stay numpy in the server process; workers wrap them as tensors.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from model_registry.spec import InputSpec, ModelSpec
from service.core.errors import WHERE, InvalidRequest, LimitExceeded, Loc
from service.wire import images

if TYPE_CHECKING:
    from service.core.settings import Settings

DTYPES = {
    "float16": np.float16,
    "float32": np.float32,
    "float64": np.float64,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "bool": np.bool_,
}
#: model input dtypes numpy lacks: carried as this, cast on the model's device
CARRIED = {"bfloat16": "float32"}


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype a model input of dtype ``name`` is carried as in this process."""
    return np.dtype(DTYPES[CARRIED.get(name, name)])


def is_tensor_object(obj: object) -> bool:
    return isinstance(obj, dict) and "b64" in obj


def decode_tensor(obj: Any, loc: Loc, max_elements: int, dtype: str | None = None) -> np.ndarray:
    """A wire tensor as an array; ``dtype`` (if given) is the dtype it must have."""
    if is_tensor_object(obj):
        return _decode_b64(obj, loc, max_elements, dtype)
    if isinstance(obj, np.ndarray):  # decoded already (OIP tensors): the same checks
        return _converted(obj, loc, max_elements, dtype)
    if isinstance(obj, bool) or not isinstance(obj, (list, int, float)):
        raise InvalidRequest(
            f'{WHERE} must be a tensor: a nested list of numbers or {{"dtype", "shape", "b64"}}',
            loc=loc,
        )
    try:
        arr = _asarray(obj)
    except ValueError:
        raise InvalidRequest(
            f"{WHERE} is a ragged nested list; every row must have the same length", loc=loc
        ) from None
    if arr.dtype.kind not in "biuf":
        if arr.dtype == object and any(v is None for v in arr.ravel()):
            raise InvalidRequest(f"{WHERE} holds null (NaN is not a valid input)", loc=loc)
        huge = next(
            (v for v in arr.ravel() if isinstance(v, int) and not isinstance(v, bool)), None
        )
        if huge is not None:  # numpy keeps integers past 64 bits as Python objects
            raise InvalidRequest(
                f"{WHERE} holds the integer {huge}, beyond the 64-bit range of a tensor", loc=loc
            )
        raise InvalidRequest(f"{WHERE} must hold only numbers", loc=loc)
    return _converted(arr, loc, max_elements, dtype)


def _converted(arr: np.ndarray, loc: Loc, max_elements: int, dtype: str | None) -> np.ndarray:
    if arr.size > max_elements:
        raise LimitExceeded(
            f"{WHERE} has {arr.size} elements; the limit is {max_elements}", loc=loc
        )
    if dtype is None:
        if arr.dtype.kind == "f":
            return _float_cast(arr, np.dtype(np.float32), loc)
        return arr.astype(np.int64, copy=False)
    target = numpy_dtype(dtype)
    if target.kind in "iub" and arr.dtype.kind == "f":
        flat = arr.ravel()
        frac = np.flatnonzero(flat != np.floor(flat))
        if frac.size:
            raise InvalidRequest(
                f"{WHERE} must hold integers ({dtype}); it holds {float(flat[frac[0]])!r}",
                loc=loc,
            )
        info = np.iinfo(target) if target.kind != "b" else None
        if info is not None:
            out = np.flatnonzero((flat > info.max) | (flat < info.min))
            if out.size:  # a JSON integer past 64 bits, read as a float
                raise InvalidRequest(
                    f"{WHERE} holds {float(flat[out[0]]):.0f}, beyond {dtype}'s range "
                    f"({info.min} to {info.max})",
                    loc=loc,
                )
        # whole numbers written as floats (3.0): taken as the integers they are
    elif target.kind == "f":
        return _float_cast(arr, target, loc)
    return arr.astype(target, copy=False)


def _float_cast(arr: np.ndarray, target: np.dtype[Any], loc: Loc) -> np.ndarray:
    """``arr`` in the float dtype ``target``; a finite number past its range, which the cast
    would make inf, is refused by name (NaN and inf as sent are ``check_finite``'s to name).
    The check costs nothing unless the cast overflows."""
    with np.errstate(over="raise"):
        try:
            return arr.astype(target, copy=False)
        except FloatingPointError:
            pass
    limit = float(np.finfo(target).max)
    flat = arr.ravel()
    with np.errstate(invalid="ignore"):
        past = flat[np.isfinite(flat) & (np.abs(flat) > limit)]
    if not past.size:  # not a value past the range: the cast as it is
        with np.errstate(over="ignore"):
            return arr.astype(target, copy=False)
    raise InvalidRequest(
        f"{WHERE} holds {float(past[0]):.4g}, beyond {target.name}'s range (±{limit:.4g})",
        loc=loc,
    )


#: rows converted per step of a long nested list: numpy holds the GIL while it converts, and
#: a large request decoded in a thread must leave the event loop its turns (health checks)
ROWS_PER_STEP = 2048


def _asarray(obj: Any) -> np.ndarray:
    if not isinstance(obj, list) or len(obj) <= ROWS_PER_STEP:
        return np.asarray(obj)
    parts = [np.asarray(obj[i : i + ROWS_PER_STEP]) for i in range(0, len(obj), ROWS_PER_STEP)]
    if len({p.shape[1:] for p in parts}) > 1:
        raise ValueError("ragged")
    for p in parts:
        if p.dtype.kind not in "biuf":
            return p  # not numbers: the caller says so, as for a short list
    return np.concatenate(parts)


def _decode_b64(obj: dict[str, Any], loc: Loc, max_elements: int, dtype: str | None) -> np.ndarray:
    name, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("b64")
    if not isinstance(name, str) or name not in DTYPES:
        raise InvalidRequest(
            f"{WHERE}.dtype must be one of {', '.join(DTYPES)}, got {name!r:.40}",
            loc=(*loc, "dtype"),
            about=loc,
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise InvalidRequest(
            f"{WHERE}.shape must be a list of non-negative ints", loc=(*loc, "shape"), about=loc
        )
    if dtype is not None and name != CARRIED.get(dtype, dtype):
        raise InvalidRequest(
            f"{WHERE} has dtype {name}; this model input takes {dtype}",
            loc=(*loc, "dtype"),
            about=loc,
        )
    count = math.prod(shape)  # Python ints: a product that overflows int64 stays what it is
    if count > max_elements:
        raise LimitExceeded(f"{WHERE} has {count} elements; the limit is {max_elements}", loc=loc)
    if not isinstance(data, str):
        raise InvalidRequest(f"{WHERE}.b64 must be a base64 string", loc=(*loc, "b64"), about=loc)
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(
            f"{WHERE}.b64 is not valid base64", loc=(*loc, "b64"), about=loc
        ) from None
    np_dtype = np.dtype(DTYPES[name]).newbyteorder("<")
    if len(raw) != count * np_dtype.itemsize:
        raise InvalidRequest(
            f"{WHERE}.b64 holds {len(raw)} bytes; shape {shape} of {name} needs "
            f"{count * np_dtype.itemsize}",
            loc=(*loc, "b64"),
            about=loc,
        )
    return (
        np.frombuffer(raw, dtype=np_dtype)
        .astype(np_dtype.newbyteorder("="), copy=True)
        .reshape(shape)
    )


def encode_tensor(arr: np.ndarray, encoding: str) -> Any:
    """An array for the response: the array itself (orjson writes nested lists) or base64."""
    arr = np.ascontiguousarray(arr)
    if encoding == "base64":
        le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        return {
            "dtype": str(arr.dtype),
            "shape": list(arr.shape),
            "b64": base64.b64encode(le.tobytes()).decode("ascii"),
        }
    return arr


def check_finite(arr: np.ndarray, loc: Loc) -> None:
    if arr.dtype.kind == "f" and not bool(np.isfinite(arr).all()):
        bad = np.argwhere(~np.isfinite(arr))[0].tolist()
        raise InvalidRequest(f"{WHERE} holds NaN or infinity (first at index {bad})", loc=loc)


def check_input(arr: np.ndarray, spec: InputSpec, loc: Loc) -> None:
    """Shape (free dims may be anything) and finiteness against the model's declared input."""
    if arr.ndim != len(spec.shape):
        raise InvalidRequest(
            f"{WHERE} has shape {list(arr.shape)}; input {spec.name!r} takes "
            f"{_shape_text(spec.shape)} ({len(spec.shape)} dims, dim 0 the examples)",
            loc=loc,
        )
    for d, (got, want) in enumerate(zip(arr.shape, spec.shape, strict=True)):
        if want is not None and d > 0 and got != want:
            raise InvalidRequest(
                f"{WHERE} has shape {list(arr.shape)}; input {spec.name!r} takes "
                f"{_shape_text(spec.shape)} (dim {d} must be {want})",
                loc=loc,
            )
    check_finite(arr, loc)


def _shape_text(shape: Sequence[int | None]) -> str:
    return (
        "["
        + ", ".join(
            "N" if i == 0 and d is None else ("*" if d is None else str(d))
            for i, d in enumerate(shape)
        )
        + "]"
    )


@dataclass(frozen=True)
class DecodedInputs:
    """Request inputs: arrays in the model's input order, or raw texts for the tokenizer."""

    arrays: tuple[np.ndarray, ...] = ()
    #: texts, or pairs of texts (a tokenizer's pair encoding)
    texts: tuple[str | tuple[str, str], ...] = ()
    #: images sent encoded (``arrays`` holds their ``pixel_values``): each file's bytes, which
    #: pictures draw over
    images: tuple[bytes, ...] = ()

    @property
    def n(self) -> int:
        return len(self.texts) if self.texts else int(self.arrays[0].shape[0])


def is_text(item: Any) -> bool:
    """A text, or a pair of texts (``["premise", "hypothesis"]``)."""
    if isinstance(item, str):
        return True
    return isinstance(item, list) and len(item) == 2 and all(isinstance(t, str) for t in item)


def decode_within(raw: Any, spec: ModelSpec, settings: Settings) -> DecodedInputs:
    """``decode_inputs`` within the service's limits: its tensor elements, batch size and
    image pixels (every route that takes inputs)."""
    return decode_inputs(
        raw,
        spec,
        settings.max_tensor_elements,
        settings.max_batch_size,
        max_image_pixels=settings.max_image_pixels,
    )


def decode_inputs(
    raw: Any, spec: ModelSpec, max_elements: int, max_batch: int, *, max_image_pixels: int
) -> DecodedInputs:
    """``inputs`` in any accepted form: one tensor, a list per input, an object by name, texts,
    encoded images (``max_image_pixels`` in all)."""
    loc: Loc = ("body", "inputs")
    names = [i.name for i in spec.inputs]
    if images.sent(raw, spec):
        values, files = images.decode(raw, spec, max_elements, max_batch, max_image_pixels)
        return DecodedInputs(arrays=(values,), images=files)
    if isinstance(raw, list) and raw and all(is_text(t) for t in raw):
        if spec.images is not None:
            raise InvalidRequest(
                f'model {spec.id!r} takes images: send [{{"image": "<base64 PNG or JPEG>"}}, '
                "...] or pixel_values as a tensor",
                loc=loc,
            )
        if not spec.takes_text:
            raise InvalidRequest(
                f"model {spec.id!r} has no tokenizer; send tensors, not text", loc=loc
            )
        if len(raw) > max_batch:
            raise LimitExceeded(
                f"inputs hold {len(raw)} texts; the limit is {max_batch} per request", loc=loc
            )
        for i, text in enumerate(raw):
            if any(not piece.strip() for piece in ([text] if isinstance(text, str) else text)):
                raise InvalidRequest(
                    f"text {i} is empty (or only white space): there is no word in it to "
                    "attribute to",
                    loc=(*loc, i),
                )
        return DecodedInputs(texts=tuple(t if isinstance(t, str) else (t[0], t[1]) for t in raw))
    if isinstance(raw, dict) and not is_tensor_object(raw):
        unknown = sorted(set(raw) - set(names))
        missing = [n for n in names if n not in raw]
        if unknown or missing:
            raise InvalidRequest(
                f"inputs by name must give exactly the model's inputs {names}"
                + (f"; unknown: {unknown}" if unknown else "")
                + (f"; missing: {missing}" if missing else ""),
                loc=loc,
            )
        parts = [(raw[n], (*loc, n)) for n in names]
    elif len(names) > 1:
        if not isinstance(raw, list) or len(raw) != len(names):
            raise InvalidRequest(
                f"model {spec.id!r} takes {len(names)} inputs {names}: send a list of "
                "that many tensors or an object keyed by input name",
                loc=loc,
            )
        parts = [(t, (*loc, i)) for i, t in enumerate(raw)]
    elif isinstance(raw, list) and len(raw) == 1 and is_tensor_object(raw[0]):
        parts = [(raw[0], (*loc, 0))]
    else:
        parts = [(raw, loc)]
    arrays = []
    for (obj, where), ispec in zip(parts, spec.inputs, strict=True):
        if isinstance(obj, list) and len(obj) > max_batch:  # before converting a long list
            raise LimitExceeded(
                f"inputs hold {len(obj)} examples; the limit is {max_batch} per request", loc=where
            )
        arr = decode_tensor(obj, where, max_elements, ispec.dtype)
        check_input(arr, ispec, where)
        arrays.append(arr)
    n = int(arrays[0].shape[0])
    for arr, (_, where) in zip(arrays, parts, strict=True):
        if arr.shape[0] != n:
            raise InvalidRequest(
                f"every input needs the same number of examples: {n} and {arr.shape[0]}",
                loc=where,
            )
    if n == 0:
        raise InvalidRequest("inputs hold no examples", loc=loc)
    if n > max_batch:
        raise LimitExceeded(
            f"inputs hold {n} examples; the limit is {max_batch} per request", loc=loc
        )
    return DecodedInputs(arrays=tuple(arrays))


def _number(value: int | float, inputs: DecodedInputs, loc: Loc) -> int | float:
    """A number baseline: a whole number as an integer (so integer inputs keep their dtype;
    float inputs take it as a float all the same), a fraction as a float (the engine then
    ablates integer inputs with its value, as Captum does); token ids take whole numbers only."""
    if float(value).is_integer() and abs(value) <= 2**53:
        return int(value)
    if inputs.texts:
        raise InvalidRequest(
            f"baselines for token inputs must be whole token ids, got {value}", loc=loc
        )
    return float(value)


#: the most rows a background set may have (``methods.engine.background.MAX_ROWS``)
MAX_BACKGROUND_ROWS = 4096


def decode_background(
    raw: dict[str, Any],
    spec: ModelSpec,
    inputs: DecodedInputs,
    max_elements: int,
    loc: Loc = ("body", "baselines"),
) -> dict[str, Any]:
    """A background set, ``{"background": rows, "weights": [...]}``: per input an array of
    rows (a number is one row of it), and the rows' weights (None: equal)."""
    unknown = sorted(set(raw) - {"background", "weights"})
    if unknown:
        raise InvalidRequest(
            f"a background set is {{background, weights}}; unknown members {unknown}", loc=loc
        )
    if inputs.texts:
        raise InvalidRequest(
            "a background set holds rows of tensor inputs; this model takes texts", loc=loc
        )
    where = (*loc, "background")
    rows = decode_baselines(raw["background"], spec, inputs, max_elements, where)
    if rows is None:
        raise InvalidRequest("background must give at least one row", loc=where)
    parts = rows if isinstance(rows, tuple) else (rows,) * len(inputs.arrays)
    arrays = [
        p if isinstance(p, np.ndarray) else np.full((1, *x.shape[1:]), p, dtype=x.dtype)
        for p, x in zip(parts, inputs.arrays, strict=True)
    ]
    counts = {int(a.shape[0]) for a in arrays}
    if len(counts) != 1:
        raise InvalidRequest(
            f"every input's background must have the same number of rows, got {sorted(counts)}",
            loc=where,
        )
    (b,) = counts
    if b > MAX_BACKGROUND_ROWS:
        raise InvalidRequest(
            f"the background has {b} rows; at most {MAX_BACKGROUND_ROWS} are taken: send a "
            "summary (K-means centres with their weights)",
            loc=where,
        )
    weights = raw.get("weights")
    if weights is not None:
        wl = (*loc, "weights")
        if (
            not isinstance(weights, list)
            or len(weights) != b
            or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
        ):
            raise InvalidRequest(f"weights must be {b} numbers, one per background row", loc=wl)
        w = np.asarray(weights, dtype=np.float64)
        if not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
            raise InvalidRequest("weights must be finite, >= 0 and not all zero", loc=wl)
        weights = w
    return {"background": tuple(arrays), "weights": weights}


def decode_baselines(
    raw: Any,
    spec: ModelSpec,
    inputs: DecodedInputs,
    max_elements: int,
    loc: Loc = ("body", "baselines"),
    *,
    background: bool = False,
) -> int | float | tuple[np.ndarray | int | float, ...] | dict[str, Any] | None:
    """``baselines`` (or another tensor per input, at ``loc``: an attack's mask): null, a
    number, one tensor, or one number/tensor per input (or by name); with ``background``,
    also a background set (``decode_background``)."""
    field = str(loc[-1])
    if raw is None:
        return None
    names = [i.name for i in spec.inputs]
    if (
        background
        and isinstance(raw, dict)
        and "background" in raw
        and not is_tensor_object(raw)
        and "background" not in names
    ):
        return decode_background(raw, spec, inputs, max_elements, loc)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        if not np.isfinite(raw):
            raise InvalidRequest(f"{field} must be finite", loc=loc)
        return _number(raw, inputs, loc)
    if isinstance(raw, dict) and not is_tensor_object(raw):
        if set(raw) != set(names):
            raise InvalidRequest(f"{field} by name must give exactly {names}", loc=loc)
        parts = [(raw[n], (*loc, n)) for n in names]
    elif len(names) > 1:
        if not isinstance(raw, list) or len(raw) != len(names):
            raise InvalidRequest(f"{field}: give one per input {names}", loc=loc)
        parts = [(b, (*loc, i)) for i, b in enumerate(raw)]
    else:
        parts = [(raw, loc)]
    out: list[np.ndarray | int | float] = []
    for (obj, where), ispec in zip(parts, spec.inputs, strict=True):
        if isinstance(obj, (int, float)) and not isinstance(obj, bool):
            out.append(_number(obj, inputs, where))
            continue
        dtype = ispec.dtype if not inputs.texts else "int64"
        arr = decode_tensor(obj, where, max_elements, dtype if is_tensor_object(obj) else None)
        arr = arr.astype(numpy_dtype(dtype), copy=False)
        if arr.ndim == len(ispec.shape) - 1:
            arr = arr[None]
        check_finite(arr, where)
        if not inputs.texts and arr.shape[1:] != inputs.arrays[len(out)].shape[1:]:
            raise InvalidRequest(
                f"{WHERE} has shape {list(arr.shape)}; it must match the input "
                f"{list(inputs.arrays[len(out)].shape)} (dim 0 may be 1 to broadcast)",
                loc=where,
            )
        out.append(arr)
    return tuple(out)
