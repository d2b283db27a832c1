"""Attribution jobs on disk: one SQLite database (WAL) for their state, and files beside it for
their requests and results, each written atomically (a temporary file, then a rename).

Layout under ``data_dir``: ``jobs.sqlite3``, and ``jobs/<id>/work.npz`` (the decoded job,
``service.jobs.stored``) plus one
``chunk-<first example>.npz`` per finished chunk. A chunk file is written before the progress
that counts it, so a crash between the two only means the chunk runs again.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.core.errors import StorageFull
from service.core.files import atomic_write

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    model_id TEXT NOT NULL,
    method TEXT NOT NULL,
    status TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL,
    chunk INTEGER NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    error TEXT,
    bytes INTEGER NOT NULL DEFAULT 0,
    operation TEXT NOT NULL DEFAULT '',
    options TEXT
);
CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, created_at);
"""


@dataclass
class JobRow:
    id: str
    owner: str
    model_id: str
    method: str
    status: str
    done: int
    total: int
    chunk: int  # the most examples in one chunk (chunks are sized by time below that)
    created_at: float
    started_at: float | None
    finished_at: float | None
    error: dict[str, Any] | None
    bytes: int
    #: the route it answers as ("attributions", "tcav", ...; CONTRACT 9.2)
    operation: str = "attributions"
    #: what its answer needs of the request beyond the work (``Capability.options``)
    options: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model_id": self.model_id,
            "operation": self.operation,
            "method": self.method,
            "status": self.status,
            "progress": {"done": self.done, "total": self.total},
            "created_at": _iso(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "error": self.error,
        }


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


#: errno values of a disk (or quota) that is full
FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full (a write, or SQLite's "database or disk is full")."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return True
    return isinstance(exc, sqlite3.OperationalError) and "full" in str(exc).lower()


@contextlib.contextmanager
def storage() -> Iterator[None]:
    """A full disk as the service's 507 (``StorageFull``), anything else as it is."""
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        if not disk_full(exc):
            raise
        raise StorageFull(
            "the jobs' disk is full; jobs already accepted wait and run once space is free: "
            "fetch and delete finished jobs, or retry later",
            headers={"Retry-After": "30"},
        ) from None


def disk_bytes(path: Path) -> int:
    """What a file really takes on disk (whole blocks), not its length."""
    st = path.stat()
    blocks = getattr(st, "st_blocks", None)
    return max(st.st_size, 512 * blocks) if blocks is not None else st.st_size


class JobStore:
    """The jobs database and files. Thread-safe (one connection, one lock): the event loop
    does the small queries, threads write the large files."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.root = Path(data_dir)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.root / "jobs.sqlite3", check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        """A database of an older version gains the columns it lacks (its jobs are
        attribution jobs, or known by their work: ``JobRunner.result``)."""
        have = {r[1] for r in self._db.execute("PRAGMA table_info(jobs)")}
        for column, decl in (("operation", "TEXT NOT NULL DEFAULT ''"), ("options", "TEXT")):
            if column not in have:
                self._db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {decl}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- rows ------------------------------------------------------------------------------
    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[JobRow]:
        with self._lock:
            cur = self._db.execute(sql, args)
            names = [d[0] for d in cur.description]
            rows = cur.fetchall()
        out = []
        for r in rows:
            d = dict(zip(names, r, strict=True))
            d["error"] = json.loads(d["error"]) if d["error"] else None
            d["options"] = json.loads(d["options"]) if d["options"] else None
            out.append(JobRow(**d))
        return out

    def _exec(self, sql: str, args: tuple[Any, ...] = ()) -> int:
        with self._lock, storage():
            return self._db.execute(sql, args).rowcount

    def create(
        self,
        owner: str,
        model_id: str,
        method: str,
        total: int,
        chunk: int,
        work: bytes,
        operation: str = "attributions",
        options: dict[str, Any] | None = None,
    ) -> JobRow:
        job_id = uuid.uuid4().hex
        path = self.dir(job_id) / "work.npz"
        try:
            with storage():
                atomic_write(path, work)
            self._exec(
                "INSERT INTO jobs (id, owner, model_id, method, status, total, chunk, "
                "created_at, bytes, operation, options) "
                "VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                (
                    job_id,
                    owner,
                    model_id,
                    method,
                    total,
                    chunk,
                    time.time(),
                    disk_bytes(path),
                    operation,
                    json.dumps(options) if options is not None else None,
                ),
            )
        except StorageFull:  # nothing half-made is left behind
            shutil.rmtree(self.dir(job_id), ignore_errors=True)
            raise
        return self.get(job_id)  # type: ignore[return-value]

    def get(self, job_id: str) -> JobRow | None:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", (job_id,))
        return rows[0] if rows else None

    def next_queued(self) -> JobRow | None:
        """The oldest job to run: queued, or interrupted (still marked running: by a restart,
        or a full disk that stopped its progress being written)."""
        rows = self._rows(
            "SELECT * FROM jobs WHERE status IN ('queued', 'running') "
            "ORDER BY created_at, id LIMIT 1"
        )
        return rows[0] if rows else None

    def page(
        self, owner: str, status: str | None, limit: int, before: tuple[float, str] | None
    ) -> list[JobRow]:
        sql = "SELECT * FROM jobs WHERE owner = ?"
        args: list[Any] = [owner]
        if status is not None:
            sql += " AND status = ?"
            args.append(status)
        if before is not None:
            sql += " AND (created_at < ? OR (created_at = ? AND id < ?))"
            args += [before[0], before[0], before[1]]
        sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
        args.append(limit)
        return self._rows(sql, tuple(args))

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall()
        return {s: 0 for s in STATUSES} | {str(s): int(n) for s, n in rows}

    def used_bytes(self) -> int:
        with self._lock:
            (n,) = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM jobs").fetchone()
        return int(n)

    def start(self, job_id: str) -> bool:
        """queued (or interrupted) -> running (False if it has finished: cancelled meanwhile)."""
        return (
            self._exec(
                "UPDATE jobs SET status = 'running', started_at = COALESCE(started_at, ?) "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (time.time(), job_id),
            )
            == 1
        )

    def progress(self, job_id: str, done: int, added_bytes: int) -> None:
        self._exec(
            "UPDATE jobs SET done = ?, bytes = bytes + ? WHERE id = ?",
            (done, added_bytes, job_id),
        )

    def finish(self, job_id: str, status: str, error: dict[str, Any] | None = None) -> bool:
        """running/queued -> a finished status (False if it had finished already)."""
        return (
            self._exec(
                "UPDATE jobs SET status = ?, finished_at = ?, error = ? "
                "WHERE id = ? AND status IN ('queued', 'running')",
                (status, time.time(), json.dumps(error) if error else None, job_id),
            )
            == 1
        )

    def requeue_interrupted(self) -> int:
        """At start-up: jobs that were running when the server stopped run again."""
        return self._exec("UPDATE jobs SET status = 'queued' WHERE status = 'running'")

    def expired(self, ttl_s: float) -> list[str]:
        rows = self._rows(
            "SELECT * FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled') "
            "AND finished_at < ?",
            (time.time() - ttl_s,),
        )
        return [r.id for r in rows]

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self.dir(job_id), ignore_errors=True)
        self._exec("DELETE FROM jobs WHERE id = ?", (job_id,))

    # -- files -----------------------------------------------------------------------------
    def dir(self, job_id: str) -> Path:
        return self.root / "jobs" / job_id

    def work(self, job_id: str) -> bytes:
        """The job as submitted, decoded (``service.jobs.stored``)."""
        return (self.dir(job_id) / "work.npz").read_bytes()

    def write_chunk(self, job_id: str, start: int, arrays: dict[str, np.ndarray]) -> int:
        """Finished examples' arrays (named by the first example, so files sort in order);
        returns the bytes the file takes on disk."""
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        path = self.dir(job_id) / f"chunk-{start:09d}.npz"
        with storage():
            atomic_write(path, buf.getvalue())
        return disk_bytes(path)

    def read_chunks(self, job_id: str) -> list[dict[str, np.ndarray]]:
        out = []
        for path in sorted(self.dir(job_id).glob("chunk-*.npz")):
            with np.load(path, allow_pickle=False) as z:
                out.append({k: z[k] for k in z.files})
        return out
