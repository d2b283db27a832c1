"""A model's background set (models.toml ``background`` and ``background_kmeans``): the
reference rows the Shapley-family methods average over when a request names no baselines.

``background`` is a ``.npy``, ``.npz`` (its first array) or ``.safetensors`` (its first tensor)
file of rows, each one example of the model's single input; ``background_kmeans = K``
summarises them into K weighted rows (``methods.kmeans``, as ``shap.kmeans``). Both are read
and checked when the models file is read, and read again (cached) where requests are built.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from methods.engine.kmeans import kmeans
from model_registry.spec import InputSpec, ModelSpec, resolve_path

SUFFIXES = (".npy", ".npz", ".safetensors")
#: the most rows a background file may hold before its summary (K-means scales with them)
MAX_FILE_ROWS = 100_000


class BackgroundError(ValueError):
    """The file cannot be a background set of the model (the registry names the field)."""


def read_rows(path: Path) -> np.ndarray:
    """The file's rows as one array (``SUFFIXES``)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise BackgroundError(f"expected a {', '.join(SUFFIXES)} file, got {path.name!r}")
    try:
        if suffix == ".npy":
            return np.load(path, allow_pickle=False)
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                if not archive.files:
                    raise BackgroundError(f"{path.name} holds no array")
                return archive[archive.files[0]]
        from safetensors.numpy import load_file  # the hf extra's; read only where named

        tensors = load_file(str(path))
        if not tensors:
            raise BackgroundError(f"{path.name} holds no tensor")
        return next(iter(tensors.values()))
    except BackgroundError:
        raise
    except ImportError:
        raise BackgroundError(
            "reading .safetensors needs the safetensors package (pip install "
            "'attrserve[hf]'); or save the rows as .npy"
        ) from None
    except (OSError, ValueError) as exc:
        raise BackgroundError(f"cannot read {path.name}: {exc}") from None


def check_rows(rows: np.ndarray, inputs: tuple[InputSpec, ...]) -> np.ndarray:
    """Rows of the model's one input: (B, *its shape), finite numbers, B >= 1."""
    if len(inputs) != 1:
        raise BackgroundError(
            f"a background file holds rows of one input; this model takes {len(inputs)}"
        )
    (spec,) = inputs
    if rows.dtype.kind not in "biuf":
        raise BackgroundError(f"expected numbers, got dtype {rows.dtype}")
    want = spec.shape[1:]
    shape = rows.shape[1:]
    if rows.ndim != len(spec.shape) or any(
        w is not None and w != s for w, s in zip(want, shape, strict=True)
    ):
        raise BackgroundError(
            f"rows of shape {list(rows.shape)} do not fit the input {spec.name!r} of shape "
            f"{['N' if d is None else d for d in spec.shape]}: expected (B, "
            f"{', '.join('*' if d is None else str(d) for d in want)})"
        )
    if rows.shape[0] < 1 or rows.shape[0] > MAX_FILE_ROWS:
        raise BackgroundError(f"expected 1 to {MAX_FILE_ROWS} rows, got {rows.shape[0]}")
    if rows.dtype.kind == "f" and not np.isfinite(rows).all():
        raise BackgroundError("the rows hold NaN or infinite values")
    return rows.astype(np.dtype(spec.dtype), copy=False)


@functools.lru_cache(maxsize=16)
def _summary(
    path: str, mtime: float, k: int | None, inputs: tuple[InputSpec, ...]
) -> tuple[np.ndarray, np.ndarray | None]:
    rows = check_rows(read_rows(Path(path)), inputs)
    if k is None:
        return rows, None
    summary = kmeans(torch.from_numpy(np.ascontiguousarray(rows)).double(), k)
    centres = summary.rows if isinstance(summary.rows, torch.Tensor) else summary.rows[0]
    weights = summary.weights
    return (
        centres.numpy().astype(rows.dtype),
        None if weights is None else weights.numpy(),
    )


def of(spec: ModelSpec) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The model's background rows and their weights (None: equal), or None without one."""
    if spec.background is None:
        return None
    path = resolve_path(spec.background, spec.base_dir)
    return _summary(str(path), path.stat().st_mtime, spec.background_kmeans, spec.inputs)
