"""Attribution jobs in-process with real workers. A full disk: submission answers 507
problem+json, an accepted job waits (its status never says failed) and resumes by itself once
there is room, and cancel works throughout. The disk is made full by the store's two ways of
writing failing as a full disk does (ENOSPC; SQLite's "database or disk is full")."""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import Settings
from service.jobs import store

X = np.random.default_rng(1).random((40, 8), dtype=np.float32).tolist()
BODY = {"method": "integrated_gradients", "inputs": X, "target": 1, "params": {"n_steps": 8}}
JOBS = "/v1/models/tabular-mlp/attribution-jobs"


class Disk:
    """Which writes fail as on a full disk: "work" (a submitted job's file), "chunk" (results),
    "insert" and "update" (SQLite)."""

    full: frozenset[str] = frozenset()


EVERYTHING = frozenset({"work", "chunk", "insert", "update"})


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    write, execute = store.atomic_write, store.JobStore._exec

    def atomic_write(path: Path, data: bytes) -> None:
        if ("chunk" if path.name.startswith("chunk-") else "work") in Disk.full:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, data)

    def _exec(self: store.JobStore, sql: str, args: tuple[Any, ...] = ()) -> int:
        if sql.lstrip().split()[0].lower() in Disk.full:
            with store.storage():
                raise sqlite3.OperationalError("database or disk is full")
        return execute(self, sql, args)

    monkeypatch.setattr(store, "atomic_write", atomic_write)
    monkeypatch.setattr(store.JobStore, "_exec", _exec)
    Disk.full = frozenset()
    # the built-ins without tabular-noisy, whose influence index would be a job of its own
    toml = "".join(
        f'[[models]]\nid = "{m}"\nsource = "builtin:{m}"\n\n' for m in ("tabular-mlp", "tiny-lm")
    )
    (tmp_path / "models.toml").write_text(toml)
    settings = Settings(
        workers=1,
        data_dir=str(tmp_path / "data"),
        job_chunk_cost=64,
        models=str(tmp_path / "models.toml"),
        worker_mode="thread",
    )
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 120
        while c.get("/v1/health/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        yield c
    Disk.full = frozenset()


def status(c: TestClient, job_id: str) -> str:
    return str(c.get(f"/v1/jobs/{job_id}").json()["status"])


def until(c: TestClient, job_id: str, want: str, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while status(c, job_id) != want:
        assert time.monotonic() < end, c.get(f"/v1/jobs/{job_id}").json()
        time.sleep(0.05)


def test_a_full_disk_holds_jobs_and_they_resume(client: TestClient, tmp_path: Path) -> None:
    c = client
    Disk.full = EVERYTHING
    r = c.post(JOBS, json=BODY)
    assert r.status_code == 507 and r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] and "disk is full" in r.json()["detail"]
    assert not list((tmp_path / "data" / "jobs").glob("*/work.npz"))  # nothing half-made

    Disk.full = frozenset({"chunk", "update"})  # jobs are taken, none can make progress
    first = c.post(JOBS, json=BODY).json()["id"]
    second = c.post(JOBS, json=BODY).json()["id"]
    time.sleep(1.5)
    assert status(c, first) in ("queued", "running") and status(c, second) == "queued"
    # cancel works on a full disk: at once, written when there is room
    assert c.delete(f"/v1/jobs/{second}").json()["status"] == "cancelled"
    assert status(c, second) == "cancelled"

    Disk.full = frozenset()  # room again: the first resumes by itself, no restart
    until(c, first, "succeeded")
    result = c.get(f"/v1/jobs/{first}/result").json()
    sync = c.post("/v1/models/tabular-mlp/attributions", json=BODY)
    if sync.status_code == 200:  # the same numbers as a synchronous answer
        np.testing.assert_allclose(result["attributions"], sync.json()["attributions"], rtol=1e-5)
    assert len(result["attributions"]) == len(X)
    until(c, second, "cancelled")
    rows = {r["id"]: r for r in c.get("/v1/jobs").json()["jobs"]}
    assert rows[second]["status"] == "cancelled" and rows[first]["status"] == "succeeded"


def test_a_job_writes_few_files(client: TestClient, tmp_path: Path) -> None:
    """Chunks are written together (about one file a second), not one small file each."""
    many = {**BODY, "inputs": np.random.default_rng(2).random((400, 8), dtype=np.float32).tolist()}
    job = client.post(JOBS, json=many).json()["id"]
    until(client, job, "succeeded")
    files = list((tmp_path / "data" / "jobs" / job).glob("chunk-*.npz"))
    result = client.get(f"/v1/jobs/{job}/result").json()
    assert len(result["attributions"]) == 400 and len(result["target"]) == 400
    assert 1 <= len(files) <= 8, len(files)


def test_a_causal_lm_takes_no_jobs(client: TestClient) -> None:
    """One prompt per request: its kind says so, and the job route refuses at submission."""
    lm = {"method": "feature_ablation", "inputs": {"prompt": "grace lives in"}, "target": None}
    r = client.post("/v1/models/tiny-lm/attribution-jobs", json=lm)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["path", "model_id"]
    assert "/v1/models/tiny-lm/attributions" in r.json()["detail"]
