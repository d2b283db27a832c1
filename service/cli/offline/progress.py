"""A run's finished chunks on disk, so an interrupted run resumes after the last of them."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from service.cli.offline.outputs import _is_tokens, _pad, _pad_tokens, _savez
from service.core.files import atomic_write


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
        atomic_write(self._chunk(k), lambda f: _savez(f, arrays))
        self.done = k + 1
        state = {"version": 1, **self.fingerprint, "chunks_done": self.done}
        text = json.dumps(state, indent=1).encode()
        atomic_write(self.dir / "state.json", lambda f: f.write(text))

    def chunks(self) -> Iterator[dict[str, Any]]:
        for k in range(self.done):
            with np.load(self._chunk(k), allow_pickle=False) as z:
                yield _decode_chunk({name: z[name] for name in z.files})

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
