"""models.toml ``[models.influence]``: the training data and checkpoints a model's influence
index is built from (CONTRACT 7.4), and reading that data.

```toml
[[models]]
id = "tabular-mlp"
source = "builtin:tabular-mlp"

[models.influence]
train_data = "train.npz"          # the model's input names and `labels` (.npz, .npy, .parquet)
checkpoints = [{ path = "ckpt-1.pt", lr = 0.1 }, { path = "ckpt-2.pt", lr = 0.05 }]
loss = "cross_entropy"            # or "mse", "nll", "bce_with_logits"
method = "tracin_cp"              # or "tracin_cp_fast", "tracin_cp_fast_rand_proj", "similarity"
layers = ["classifier"]           # tracin_cp: these layers' parameters; similarity: required
projection_dim = 16               # tracin_cp_fast_rand_proj
```
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_registry.spec import ModelSpec, resolve_path
from model_registry.table import LAYER, Table, describe_value

METHODS = ("tracin_cp", "tracin_cp_fast", "tracin_cp_fast_rand_proj", "similarity")
LOSSES = ("cross_entropy", "mse", "nll", "bce_with_logits")
KEYS = (
    "train_data",
    "checkpoints",
    "loss",
    "method",
    "layers",
    "projection_dim",
    "similarity",
    "batch_size",
    "seed",
)
DATA_SUFFIXES = (".npz", ".npy", ".parquet")


@dataclass(frozen=True)
class InfluenceSpec:
    train_data: str  # the file, resolved
    #: (file, learning rate) per checkpoint, in training order
    checkpoints: tuple[tuple[str, float], ...]
    loss: str = "cross_entropy"
    method: str = "tracin_cp"
    layers: tuple[str, ...] | None = None
    projection_dim: int | None = None
    similarity: str = "cosine"
    batch_size: int = 64
    seed: int = 0

    def digest(self, version: str) -> str:
        """sha256 of what the index depends on: the model's version, the data's and the
        checkpoints' bytes, and the settings."""
        h = hashlib.sha256(
            repr(
                (
                    version,
                    self.loss,
                    self.method,
                    self.layers,
                    self.projection_dim,
                    self.similarity,
                    self.seed,
                )
            ).encode()
        )
        for path in (self.train_data, *(p for p, _ in self.checkpoints)):
            with open(path, "rb") as f:
                h.update(hashlib.file_digest(f, "sha256").digest())
        h.update(repr([lr for _, lr in self.checkpoints]).encode())
        return h.hexdigest()


def parse(table: Table) -> InfluenceSpec | None:
    """The model's ``influence`` sub-table (None when it has none)."""
    raw = table.get("influence")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        table.fail("influence", f"expected a table, got {describe_value(raw)}")
    sub = Table(raw, table.file, table.index, table.base_dir)
    sub.id = table.id
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        sub.fail(f"influence.{unknown[0]}", f"unknown key(s) {unknown}; expected some of {KEYS}")

    def field(key: str) -> str:
        return f"influence.{key}"

    method = raw.get("method", "tracin_cp")
    if method not in METHODS:
        sub.fail(field("method"), f"expected one of {list(METHODS)}, got {describe_value(method)}")
    loss = raw.get("loss", "cross_entropy")
    if loss not in LOSSES:
        sub.fail(field("loss"), f"expected one of {list(LOSSES)}, got {describe_value(loss)}")
    data = raw.get("train_data")
    if not isinstance(data, str) or Path(data).suffix not in DATA_SUFFIXES:
        sub.fail(
            field("train_data"),
            f"expected a {'/'.join(DATA_SUFFIXES)} file holding the model's inputs by name "
            f"and labels, got {describe_value(data)}",
        )
    table.inside(data, field("train_data"))
    table.existing(data, field("train_data"))
    points = raw.get("checkpoints", [])
    if not isinstance(points, list) or (method != "similarity" and not points):
        sub.fail(
            field("checkpoints"),
            f'expected an array of {{path = "...", lr = 0.1}} tables, got {describe_value(points)}',
        )
    checkpoints = []
    for j, cp in enumerate(points):
        at = field(f"checkpoints[{j}]")
        if (
            not isinstance(cp, dict)
            or not isinstance(cp.get("path"), str)
            or set(cp)
            - {
                "path",
                "lr",
            }
        ):
            sub.fail(at, f'expected {{path = "...", lr = 0.1}}, got {describe_value(cp)}')
        lr = cp.get("lr", 1.0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0:
            sub.fail(f"{at}.lr", f"expected a positive number, got {describe_value(lr)}")
        table.inside(cp["path"], f"{at}.path")
        table.existing(cp["path"], f"{at}.path")
        checkpoints.append((str(resolve_path(cp["path"], table.base_dir)), float(lr)))
    layers = raw.get("layers")
    if layers is not None and (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(p, str) and LAYER.match(p) for p in layers)
    ):
        sub.fail(field("layers"), f"expected an array of dotted module paths, got {layers!r}")
    if method == "similarity" and not layers:
        sub.fail(field("layers"), "similarity compares activations at layers: name them")
    projection = raw.get("projection_dim")
    if projection is not None and (type(projection) is not int or projection < 1):
        sub.fail(field("projection_dim"), f"expected a positive integer, got {projection!r}")
    similarity = raw.get("similarity", "cosine")
    if similarity not in ("cosine", "euclidean"):
        sub.fail(field("similarity"), f"expected 'cosine' or 'euclidean', got {similarity!r}")
    batch = raw.get("batch_size", 64)
    if type(batch) is not int or batch < 1:
        sub.fail(field("batch_size"), f"expected a positive integer, got {batch!r}")
    seed = raw.get("seed", 0)
    if type(seed) is not int or seed < 0:
        sub.fail(field("seed"), f"expected a non-negative integer, got {seed!r}")
    return InfluenceSpec(
        train_data=str(resolve_path(data, table.base_dir)),
        checkpoints=tuple(checkpoints),
        loss=loss,
        method=method,
        layers=None if layers is None else tuple(layers),
        projection_dim=projection,
        similarity=similarity,
        batch_size=batch,
        seed=seed,
    )


def read_train_data(spec: ModelSpec, path: str) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """The training inputs (in the model's input order) and labels from ``path``: a ``.npz``
    with one array per input name and ``labels``, a ``.npy`` structured array with those
    fields, or a ``.parquet`` file with those columns (lists per row for inputs of more dims).
    Raises ValueError naming what is missing."""
    names = [i.name for i in spec.inputs]
    suffix = Path(path).suffix
    columns: dict[str, Any]
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            columns = {k: f[k] for k in f.files}
    elif suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.dtype.names is None:
            raise ValueError(
                f"{path} holds a plain array; a structured one with fields {names}"
                " and 'labels' is needed"
            )
        columns = {k: arr[k] for k in arr.dtype.names}
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                f"{path}: reading .parquet needs pyarrow (pip install 'attrserve[parquet]')"
            ) from None
        t = pq.read_table(path)
        columns = {k: np.asarray(t.column(k).to_pylist()) for k in t.column_names}
    missing = [k for k in (*names, "labels") if k not in columns]
    if missing:
        raise ValueError(f"{path} has no {missing}; it holds {sorted(columns)}")
    inputs = []
    for spec_in in spec.inputs:
        a = np.asarray(columns[spec_in.name])
        shape = tuple(d for d in spec_in.shape[1:])
        if all(d is not None for d in shape) and a.ndim == 2 and len(shape) > 1:
            a = a.reshape(len(a), *(int(d) for d in shape if d is not None))
        inputs.append(a.astype(spec_in.dtype if spec_in.dtype != "bfloat16" else "float32"))
    labels = np.asarray(columns["labels"])
    n = {len(a) for a in (*inputs, labels)}
    if len(n) != 1:
        raise ValueError(f"{path}: the inputs and labels have different lengths {sorted(n)}")
    return tuple(inputs), labels
