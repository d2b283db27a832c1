"""Attribution drift monitors: per model, a reference profile (each label's aggregated
attribution per feature), a window of the attributions the model has served since (a sampled
share), and the nDCG of the live profile's ranking against the reference's, per label.

``observe`` is on the request path: a dictionary lookup for a model without a monitor; with
one, a coin flip per example and its flattened attributions appended to a bounded deque under
a lock. The rest (aggregates, nDCG, the gauge, the file) happens on a GET and in the flusher,
which writes a changed monitor to ``<data dir>/monitors/<model>.json`` and ``.npz`` (written
whole to a temporary file, then renamed) about once a second and at shutdown: a restarted
server finds its monitors, their references and their windows.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.monitor.ndcg import ndcg
from service.serving.profiles import per_label

log = logging.getLogger("attrserve.monitor")


@dataclass
class Monitor:
    """One model's monitor: its settings, its reference and its live window."""

    model_id: str
    agg: str
    sample: float
    window: int
    ndcg_threshold: float
    min_examples: int
    features: list[str]
    #: each label's reference profile, one value per feature
    reference: dict[str, list[float]]
    #: where the reference came from: {"job": id} or {"inputs": n, "method": ...}
    source: dict[str, Any]
    started_at: float = field(default_factory=time.time)
    rows: deque[tuple[str, np.ndarray]] = field(default_factory=deque)
    seen: int = 0  # examples that joined since it started (the window keeps the last ones)
    dirty: bool = True

    def __post_init__(self) -> None:
        self.rows = deque(self.rows, maxlen=self.window)

    def live(self) -> dict[str, dict[str, Any]]:
        """Each label's live profile over the window."""
        rows = list(self.rows)
        if not rows:
            return {}
        labels = [label for label, _ in rows]
        profiles = per_label(np.stack([v for _, v in rows]), labels, self.agg)
        return {
            label: {"examples": labels.count(label), "values": values.tolist()}
            for label, values in profiles.items()
        }

    def state(self) -> dict[str, Any]:
        """What ``GET /v1/models/{id}/monitor`` answers."""
        live = self.live()
        scores = {
            label: ndcg(np.asarray(ref), np.asarray(live[label]["values"]))
            for label, ref in self.reference.items()
            if label in live
        }
        count = len(self.rows)
        if count < self.min_examples:
            status = "warming_up"
        elif any(v < self.ndcg_threshold for v in scores.values()):
            status = "violation"
        else:
            status = "ok"
        return {
            "model_id": self.model_id,
            "status": status,
            "examples": count,
            "seen": self.seen,
            "ndcg": scores,
            "agg": self.agg,
            "sample": self.sample,
            "window": self.window,
            "ndcg_threshold": self.ndcg_threshold,
            "min_examples": self.min_examples,
            "features": self.features,
            "reference": {label: {"values": v} for label, v in self.reference.items()},
            "reference_source": self.source,
            "live": live,
            "started_at": self.started_at,
        }

    def settings(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id, "agg": self.agg, "sample": self.sample,
            "window": self.window, "ndcg_threshold": self.ndcg_threshold,
            "min_examples": self.min_examples, "features": self.features,
            "reference": self.reference, "source": self.source, "started_at": self.started_at,
            "seen": self.seen,
        }  # fmt: skip


class Monitors:
    """Every model's monitor, kept in memory and in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.by_model: dict[str, Monitor] = {}
        self.lock = threading.Lock()
        self._random = random.Random()

    # -- the request path -------------------------------------------------------------------
    def observe(self, model_id: str, labels: list[str], vectors: np.ndarray) -> None:
        """A served answer's examples (their labels and flattened attributions), each joining
        the model's window with the monitor's ``sample`` probability."""
        monitor = self.by_model.get(model_id)
        if monitor is None or vectors.shape[1] != len(monitor.features):
            return
        with self.lock:
            for label, vector in zip(labels, vectors, strict=True):
                if monitor.sample >= 1.0 or self._random.random() < monitor.sample:
                    monitor.rows.append((label, vector))
                    monitor.seen += 1
                    monitor.dirty = True

    # -- settings ---------------------------------------------------------------------------
    def put(self, monitor: Monitor) -> None:
        with self.lock:
            self.by_model[monitor.model_id] = monitor
        self.flush_one(monitor)

    def get(self, model_id: str) -> Monitor | None:
        return self.by_model.get(model_id)

    def delete(self, model_id: str) -> Monitor | None:
        with self.lock:
            monitor = self.by_model.pop(model_id, None)
        for suffix in (".json", ".npz"):
            (self.directory / f"{_safe(model_id)}{suffix}").unlink(missing_ok=True)
        return monitor

    # -- persistence ------------------------------------------------------------------------
    def load(self, served: set[str]) -> None:
        """The monitors of the served models found in the directory."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.json")):
            try:
                saved = json.loads(path.read_text())
                if saved["model_id"] not in served:
                    continue
                rows: list[tuple[str, np.ndarray]] = []
                window = path.with_suffix(".npz")
                if window.exists():
                    with np.load(window, allow_pickle=False) as data:
                        rows = list(zip(data["labels"].tolist(), data["vectors"], strict=True))
                seen = int(saved.pop("seen", len(rows)))
                monitor = Monitor(**saved, rows=deque(rows), seen=seen, dirty=False)
                self.by_model[monitor.model_id] = monitor
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("attrserve: monitor file %s is unreadable (%s); skipped", path, exc)

    def flush(self) -> list[Monitor]:
        """Write every changed monitor; the ones written."""
        written = []
        for monitor in list(self.by_model.values()):
            if monitor.dirty:
                self.flush_one(monitor)
                written.append(monitor)
        return written

    def flush_one(self, monitor: Monitor) -> None:
        with self.lock:
            monitor.dirty = False
            rows = list(monitor.rows)
            settings = monitor.settings()
        self.directory.mkdir(parents=True, exist_ok=True)
        base = self.directory / _safe(monitor.model_id)
        labels = np.asarray([label for label, _ in rows], dtype=str)
        width = len(monitor.features)
        vectors = np.stack([v for _, v in rows]) if rows else np.zeros((0, width), np.float32)
        _atomic(base.with_suffix(".npz"), lambda f: np.savez(f, labels=labels, vectors=vectors))
        _atomic(base.with_suffix(".json"), lambda f: f.write(json.dumps(settings).encode()))


def _safe(model_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in model_id)


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
