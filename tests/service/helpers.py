"""Shared helpers: building ModelSpecs and apps without the registry's files."""

from __future__ import annotations

import base64

import numpy as np


def b64(arr: np.ndarray) -> dict[str, object]:
    arr = np.ascontiguousarray(arr)
    return {
        "dtype": str(arr.dtype),
        "shape": list(arr.shape),
        "b64": base64.b64encode(arr.astype(arr.dtype.newbyteorder("<")).tobytes()).decode(),
    }


def from_b64(obj: dict[str, object]) -> np.ndarray:
    raw = base64.b64decode(str(obj["b64"]))
    return np.frombuffer(raw, dtype=np.dtype(str(obj["dtype"])).newbyteorder("<")).reshape(
        obj["shape"]  # type: ignore[arg-type]
    )
