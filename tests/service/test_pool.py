"""The pool's dispatch without processes: adaptive batching, one sealed batch ready behind the
running one, the queue limit counting that ready batch, and requeueing it when a worker dies."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import pytest

from service.errors import QueueFull, WorkerLost
from service.pool.jobs import Batch, Job, Reply
from service.pool.pool import WorkerPool
from service.settings import Settings
from service.telemetry import Telemetry


class FakeConn:
    def __init__(self) -> None:
        self.sent: list[Batch] = []

    def send(self, msg: Any) -> None:
        self.sent.append(msg)


def job(i: int, key: tuple[Any, ...] | None = ("k",)) -> Job:
    return Job(
        id=i, model_id="m", method="saliency", arrays=(np.zeros((1, 2), np.float32),), texts=(),
        target=None, baselines=None, params={}, internal_batch_size=None,
        perturbations_per_eval=None, noise_tunnel=None, seed=None, return_delta=False,
        deadline=time.time() + 60, n=1, cost=1, key=key,
    )  # fmt: skip


def pool(**settings: Any) -> tuple[WorkerPool, FakeConn]:
    p = WorkerPool(Settings(**settings), [], Telemetry(), 1)
    p._loop = asyncio.get_running_loop()
    p._stopping = True  # never spawn a real process in these tests
    w = p.workers[0]
    conn = FakeConn()
    w.state, w.conn, w.generation = "ready", conn, 1  # type: ignore[assignment]
    return p, conn


def done(p: WorkerPool, batch: Batch) -> None:
    replies = [Reply(job_id=j.id) for j in batch.jobs]
    p._on_message(p.workers[0], 1, ("done", batch.id, replies))


async def _adaptive() -> None:
    p, conn = pool()
    f1 = p.submit(job(1))
    assert [len(b.jobs) for b in conn.sent] == [1]  # idle worker: sent at once, no window
    p.submit(job(2))
    p.submit(job(3))
    p.submit(job(4))
    assert len(conn.sent) == 1 and p.queue_depth() == 3  # may still grow: waits, merging
    p.submit(job(5, key=None))
    assert [len(b.jobs) for b in conn.sent] == [1]  # behind the older batch (FIFO)
    done(p, conn.sent[0])
    assert f1.done() and f1.result().job_id == 1
    # the waiting three went as one batch, and the sealed one to the ready slot behind it
    assert [len(b.jobs) for b in conn.sent] == [1, 3, 1]


async def _ready_slot() -> None:
    p, conn = pool(batch_max_cost=2)
    p.submit(job(1))
    p.submit(job(2, key=None))  # never merged: sealed, so it waits in the ready slot
    assert [len(b.jobs) for b in conn.sent] == [1, 1]
    done(p, conn.sent[0])
    p.submit(job(3))
    p.submit(job(4))  # the batch is full (cost 2): sealed, to the ready slot
    assert [len(b.jobs) for b in conn.sent] == [1, 1, 2]


async def _queue_full() -> None:
    p, _ = pool(queue_size=1, batching=False)
    p.submit(job(1))  # computing
    p.submit(job(2))  # ready behind it: counts as waiting
    with pytest.raises(QueueFull):
        p.submit(job(3))


async def _worker_lost() -> None:
    p, _ = pool()
    f1, f2 = p.submit(job(1)), p.submit(job(2, key=None))
    p._on_dead(p.workers[0], 1)
    assert isinstance(f1.exception(), WorkerLost)
    assert not f2.done() and p.queue_depth() == 1  # never started: waits for a new worker


def test_adaptive_dispatch_and_pipelining() -> None:
    asyncio.run(_adaptive())


def test_ready_slot_takes_sealed_batches_only() -> None:
    asyncio.run(_ready_slot())


def test_ready_batch_counts_towards_the_queue_limit() -> None:
    asyncio.run(_queue_full())


def test_unstarted_batch_survives_a_lost_worker() -> None:
    asyncio.run(_worker_lost())
