"""Open Inference Protocol v2 tensors: datatypes both ways, JSON data, and the binary tensor
data extension (Triton's): a JSON header of ``Inference-Header-Content-Length`` bytes, then each
binary tensor's raw little-endian bytes in input order (``parameters.binary_data_size``).

BF16 has no numpy dtype: it travels as float32 in the server and is cast to bfloat16 on the
model's device; on the wire it is the top half of each float32. BYTES elements are UTF-8 texts
(raw texts for token models), in binary each as a 4-byte little-endian length and the bytes.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from service.core.errors import BodyTooLarge, InvalidRequest, LimitExceeded, Loc, MalformedRequest

#: OIP datatype -> numpy dtype (BF16 and BYTES are handled apart)
NUMPY: dict[str, np.dtype[Any]] = {
    name: np.dtype(dt)
    for name, dt in {
        "BOOL": np.bool_,
        "UINT8": np.uint8,
        "UINT16": np.uint16,
        "UINT32": np.uint32,
        "UINT64": np.uint64,
        "INT8": np.int8,
        "INT16": np.int16,
        "INT32": np.int32,
        "INT64": np.int64,
        "FP16": np.float16,
        "FP32": np.float32,
        "FP64": np.float64,
    }.items()
}
DATATYPES = (*NUMPY, "BF16", "BYTES")
#: torch dtype name (model inputs, outputs) -> OIP datatype
OF_TORCH = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "bfloat16": "BF16",
    "float32": "FP32",
    "float64": "FP64",
}
_OF_NUMPY = {dt: name for name, dt in NUMPY.items()}
HEADER = "inference-header-content-length"


def datatype_of(arr: np.ndarray) -> str:
    return _OF_NUMPY.get(arr.dtype, "FP32")


def _where(loc: Loc) -> str:
    return ".".join(str(p) for p in loc[1:]) or "body"


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """A request body sent with ``Content-Encoding: gzip | deflate`` (tritonclient's request
    compression), inflated to at most ``limit`` bytes."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise InvalidRequest(
            f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or none",
            loc=("header", "content-encoding"),
        )
    inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise MalformedRequest(
            f"the body is not valid {encoding} data", loc=("header", "content-encoding")
        ) from None
    if len(out) > limit:  # a body over the limit, however it was sent: 413
        raise BodyTooLarge(
            f"the body inflates to more than this server's limit of {limit} bytes",
            loc=("body",),
        )
    return out


def split_body(body: bytes, header_length: str | None) -> tuple[Any, memoryview]:
    """The JSON header (parsed) and the binary part that follows it."""
    view = memoryview(body)
    if header_length is None:
        size = len(body)
    elif not header_length.strip().isdigit() or int(header_length) > len(body):
        raise MalformedRequest(
            f"Inference-Header-Content-Length {header_length!r:.20} must be the JSON header's "
            f"size in bytes, at most the body's {len(body)}",
            loc=("header", HEADER),
        )
    else:
        size = int(header_length)
    try:
        header = orjson.loads(view[:size])
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(f"the request header is not valid JSON: {exc}") from None
    return header, view[size:]


def _count(shape: Sequence[int], loc: Loc, max_elements: int) -> int:
    if any(d < 0 for d in shape):
        raise InvalidRequest(
            f"{_where(loc)}.shape must not hold negative dims", loc=(*loc, "shape")
        )
    count = math.prod(shape)
    if count > max_elements:
        raise LimitExceeded(
            f"{_where(loc)} has {count} elements; the limit is {max_elements}", loc=loc
        )
    return count


def _texts_binary(raw: memoryview, count: int, loc: Loc, as_bytes: bool = False) -> list[Any]:
    texts: list[Any] = []
    at = 0
    for _ in range(count):
        if at + 4 > len(raw):
            raise InvalidRequest(f"{_where(loc)}: the BYTES data ends early", loc=loc)
        (size,) = struct.unpack_from("<I", raw, at)
        item = bytes(raw[at + 4 : at + 4 + size])
        if len(item) != size:
            raise InvalidRequest(f"{_where(loc)}: the BYTES data ends early", loc=loc)
        texts.append(item if as_bytes else _utf8(item, loc))
        at += 4 + size
    if at != len(raw):
        raise InvalidRequest(
            f"{_where(loc)}: binary_data_size holds more than its {count} BYTES elements", loc=loc
        )
    return texts


def _utf8(item: bytes | str, loc: Loc) -> str:
    if isinstance(item, str):
        return item
    try:
        return item.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(
            f"{_where(loc)} holds bytes that are not UTF-8 text", loc=loc
        ) from None


def decode(
    t: Any, binary: memoryview, offset: int, loc: Loc, max_elements: int, files: bool = False
) -> tuple[np.ndarray | list[Any], int]:
    """One request input (a ``RequestInput``) as an array, or texts for BYTES (``files``: in
    binary, each element's bytes as they are: encoded images); the offset of the next binary
    tensor."""
    shape, datatype = list(t.shape), t.datatype
    if datatype not in DATATYPES:
        raise InvalidRequest(
            f"{_where(loc)}.datatype must be one of {', '.join(DATATYPES)}, got {datatype!r:.20}",
            loc=(*loc, "datatype"),
        )
    count = _count(shape, loc, max_elements)
    size = (t.parameters or {}).get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidRequest(
                f"{_where(loc)}.parameters.binary_data_size must be a byte count",
                loc=(*loc, "parameters", "binary_data_size"),
            )
        if offset + size > len(binary):
            raise InvalidRequest(
                f"{_where(loc)}: binary_data_size {size} runs past the end of the body "
                f"({len(binary) - offset} bytes left)",
                loc=(*loc, "parameters", "binary_data_size"),
            )
        raw = binary[offset : offset + size]
        if datatype == "BYTES":
            return _texts_binary(raw, count, loc, files), offset + size
        wire = np.dtype("<u2") if datatype == "BF16" else NUMPY[datatype].newbyteorder("<")
        if size != count * wire.itemsize:
            raise InvalidRequest(
                f"{_where(loc)}: binary_data_size {size} does not fit shape {shape} of "
                f"{datatype} ({count * wire.itemsize} bytes)",
                loc=(*loc, "parameters", "binary_data_size"),
            )
        arr = np.frombuffer(raw, dtype=wire).reshape(shape)
        if datatype == "BF16":
            return (arr.astype(np.uint32) << 16).view(np.float32), offset + size
        return arr.astype(wire.newbyteorder("="), copy=True), offset + size
    if t.data is None:
        raise InvalidRequest(
            f"{_where(loc)} has neither data nor parameters.binary_data_size", loc=(*loc, "data")
        )
    data = t.data if isinstance(t.data, list) else [t.data]
    if datatype == "BYTES":
        flat = _flatten(data)
        if len(flat) != count or not all(isinstance(v, str) for v in flat):
            raise InvalidRequest(
                f"{_where(loc)}.data must hold {count} strings for shape {shape}",
                loc=(*loc, "data"),
            )
        return flat, offset
    try:
        arr = np.asarray(data)
    except ValueError:
        raise InvalidRequest(f"{_where(loc)}.data is ragged", loc=(*loc, "data")) from None
    if arr.dtype.kind not in "biuf":
        raise InvalidRequest(f"{_where(loc)}.data must hold only numbers", loc=(*loc, "data"))
    if arr.size != count:
        raise InvalidRequest(
            f"{_where(loc)}.data holds {arr.size} elements; shape {shape} needs {count}",
            loc=(*loc, "data"),
        )
    dtype = np.dtype(np.float32) if datatype == "BF16" else NUMPY[datatype]
    if dtype.kind in "biu" and arr.dtype.kind == "f":
        raise InvalidRequest(
            f"{_where(loc)}.data must hold integers ({datatype})", loc=(*loc, "data")
        )
    return arr.astype(dtype, copy=False).reshape(shape), offset


def _flatten(data: list[Any]) -> list[Any]:
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for v in stack[-1]:
            if isinstance(v, list):
                stack.append(iter(v))
                break
            out.append(v)
        else:
            stack.pop()
    return out


def encode(
    name: str, value: np.ndarray | list[list[str]], binary: bool
) -> tuple[dict[str, Any], bytes | None]:
    """One response output: its JSON part, and its bytes when sent as binary data."""
    if isinstance(value, list):  # texts (tokens): BYTES [N, L], rows padded with ""
        width = max((len(r) for r in value), default=0)
        rows = [[*r, *[""] * (width - len(r))] for r in value]
        flat = [s for r in rows for s in r]
        out: dict[str, Any] = {"name": name, "shape": [len(rows), width], "datatype": "BYTES"}
        if not binary:
            return {**out, "data": flat}, None
        encoded = [s.encode("utf-8") for s in flat]
        data = b"".join(struct.pack("<I", len(e)) + e for e in encoded)
        return {**out, "parameters": {"binary_data_size": len(data)}}, data
    arr = np.ascontiguousarray(value)
    out = {"name": name, "shape": list(arr.shape), "datatype": datatype_of(arr)}
    if not binary:
        return {**out, "data": arr.reshape(-1)}, None
    data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return {**out, "parameters": {"binary_data_size": len(data)}}, data
