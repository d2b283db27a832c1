"""A worker group's dispatch without processes: adaptive batching, one sealed batch ready behind the
running one, the queue limit counting that ready batch, requeueing it when a worker dies,
cancellation freeing queue slots at once, and the threads each batch computes on."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import model_registry
from service.core.errors import QueueFull, WorkerLost
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.core.work import Attribution, Batch, Prediction, Reply
from service.pool.cores import Cores
from service.pool.costs import HEAVY_MS, RETRY
from service.pool.group import Group
from service.pool.inthread import WorkerThread
from service.pool.records import Pending, Worker
from service.worker import preload
from service.worker.channel import HEADER
from service.worker.messages import Cancel, Replied


class FakeWriter:
    """The worker's channel: what the pool wrote, decoded."""

    def __init__(self) -> None:
        self.sent: list[Batch] = []
        self.cancelled: list[int] = []

    def write(self, data: bytes) -> None:
        match pickle.loads(data[HEADER.size :]):
            case Batch() as batch:
                self.sent.append(batch)
            case Cancel(work_ids):
                self.cancelled.extend(work_ids)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def job(i: int, key: tuple[Any, ...] | None = ("k",)) -> Attribution:
    return Attribution(
        id=i, model_id="m", method="saliency", arrays=(np.zeros((1, 2), np.float32),), texts=(),
        target=None, baselines=None, params={}, internal_batch_size=None,
        perturbations_per_eval=None, noise_tunnel=None, seed=None, return_delta=False,
        deadline=time.time() + 60, n=1, cost=1, key=key,
    )  # fmt: skip


def pool(**settings: Any) -> tuple[Group, FakeWriter]:
    p = Group("g", Settings(**settings), [], Telemetry(), range(1))
    p._loop = asyncio.get_running_loop()
    p._stopping = True  # never spawn a real process in these tests
    w = p.workers[0]
    conn = FakeWriter()
    w.state, w.writer, w.generation = "ready", conn, 1  # type: ignore[assignment]
    return p, conn


def done(p: Group, batch: Batch) -> None:
    replies = [Reply(work_id=j.id) for j in batch.works]
    p._on_message(p.workers[0], 1, Replied(batch.id, replies))


async def _adaptive() -> None:
    p, conn = pool()
    f1 = p.submit(job(1)).future
    assert [len(b.works) for b in conn.sent] == [1]  # idle worker: sent at once, no window
    p.submit(job(2))
    p.submit(job(3))
    p.submit(job(4))
    assert len(conn.sent) == 1 and p.queue_depth() == 3  # may still grow: waits, merging
    p.submit(job(5, key=None))
    assert [len(b.works) for b in conn.sent] == [1]  # behind the older batch (FIFO)
    done(p, conn.sent[0])
    assert f1.done() and f1.result().work_id == 1
    # the waiting three went as one batch, and the sealed one to the ready slot behind it
    assert [len(b.works) for b in conn.sent] == [1, 3, 1]


async def _ready_slot() -> None:
    p, conn = pool(batch_max_cost=2)
    p.submit(job(1))
    p.submit(job(2, key=None))  # never merged: sealed, so it waits in the ready slot
    assert [len(b.works) for b in conn.sent] == [1, 1]
    done(p, conn.sent[0])
    p.submit(job(3))
    p.submit(job(4))  # the batch is full (cost 2): sealed, to the ready slot
    assert [len(b.works) for b in conn.sent] == [1, 1, 2]


async def _queue_full() -> None:
    p, _ = pool(queue_size=1, batching=False)
    p.submit(job(1))  # computing
    p.submit(job(2))  # ready behind it: counts as waiting
    with pytest.raises(QueueFull):
        p.submit(job(3))


async def _worker_lost() -> None:
    p, _ = pool()
    f1, f2 = p.submit(job(1)).future, p.submit(job(2, key=None)).future
    p._on_dead(p.workers[0], 1, "a test")
    assert isinstance(f1.exception(), WorkerLost)
    assert not f2.done() and p.queue_depth() == 1  # never started: waits for a new worker


async def _cancel() -> None:
    p, conn = pool(queue_size=2)
    running = p.submit(job(1))  # computing
    queued = [p.submit(job(i)) for i in (2, 3)]  # waiting, merged
    with pytest.raises(QueueFull):
        p.submit(job(4))
    p.cancel(queued[0])
    assert p.queue_depth() == 1 and queued[0].future.cancelled()
    p.submit(job(5))  # the slot is free at once
    assert conn.cancelled == []  # nothing was sent for it: nothing to stop
    p.cancel(running)  # with the worker: it is told to stop
    assert conn.cancelled == [1]
    assert p.workers[0].outstanding[0].abandoned_at is not None
    done(p, conn.sent[0])  # the worker answers (cancelled): the batch behind goes out
    assert [[j.id for j in b.works] for b in conn.sent] == [[1], [3, 5]]


def test_cancel_frees_the_slot_and_tells_the_worker() -> None:
    asyncio.run(_cancel())


def test_adaptive_dispatch_and_pipelining() -> None:
    asyncio.run(_adaptive())


def test_ready_slot_takes_sealed_batches_only() -> None:
    asyncio.run(_ready_slot())


def test_ready_batch_counts_towards_the_queue_limit() -> None:
    asyncio.run(_queue_full())


def test_unstarted_batch_survives_a_lost_worker() -> None:
    asyncio.run(_worker_lost())


def rows_job(i: int, n: int, cost_each: int, key: tuple[Any, ...] | None = ("k",)) -> Attribution:
    """``n`` examples, each its index (so a joined answer shows their order)."""
    arrays = (np.arange(n, dtype=np.float32).reshape(n, 1),)
    return dataclasses.replace(job(i, key), arrays=arrays, n=n, cost=n * cost_each)


def answer(p: Group, batch: Batch, compute_ms: float = 1.0) -> None:
    """The worker's reply: each job's input as its attributions."""
    replies = [
        Reply(work_id=j.id, attributions=[j.arrays[0] * 2], compute_ms=compute_ms)
        for j in batch.works
    ]
    p._on_message(p.workers[0], 1, Replied(batch.id, replies))


async def _cheap_first() -> None:
    p, conn = pool()
    p.costs.rates["m", "saliency"] = 1.0  # ms per forward row
    p.submit(job(1, key=None))  # computing
    expensive = p.submit(rows_job(2, 1, 500, key=None))  # 500 ms: an idle worker only
    cheap = p.submit(job(3, key=None))  # 1 ms: may wait in the ready slot
    assert [[j.id for j in b.works] for b in conn.sent] == [[1], [3]]
    answer(p, conn.sent[0])
    answer(p, conn.sent[1])
    assert cheap.future.done() and not expensive.future.done()
    assert [j.id for j in conn.sent[2].works] == [2]


def test_cheap_work_goes_first_and_only_small_work_waits_in_the_ready_slot() -> None:
    asyncio.run(_cheap_first())


async def _split() -> None:
    p, conn = pool()
    whole = p.submit(rows_job(1, 10, 20))  # rate unknown: goes whole, and is measured
    answer(p, conn.sent[0], compute_ms=200.0)  # 200 ms for 200 rows: 1 ms per row
    assert whole.future.result().attributions[0].shape == (10, 1)
    big = p.submit(rows_job(2, 40, 12))  # 12 ms per example: pieces of 8 examples (96 ms)
    assert len(big.parts) == 5 and [len(b.works[0].arrays[0]) for b in conn.sent[1:]] == [8]
    cheap = p.submit(job(3, key=None))  # waits behind one piece, not the whole request
    assert [j.id for j in conn.sent[2].works] == [3]
    answer(p, conn.sent[1])
    answer(p, conn.sent[2])
    assert cheap.future.done() and not big.future.done()
    for _ in range(4):  # the other pieces, one at a time
        answer(p, conn.sent[-1])
    assert len(conn.sent) == 7
    await asyncio.sleep(0)  # the pieces' done callbacks run
    got = big.future.result()
    np.testing.assert_array_equal(got.attributions[0][:, 0], np.arange(40) * 2)
    assert got.work_id == 2


def test_an_expensive_request_is_split_and_joined_in_order() -> None:
    asyncio.run(_split())


def test_pieces_are_even() -> None:
    """17 examples in pieces of at most 8 are 6, 6 and 5, not 8, 8 and 1: a piece of one
    example rounds otherwise (a product of one row takes MKL's matrix-vector path)."""
    from service.pool.split import pieces

    assert [p.n for p in pieces(rows_job(1, 17, 1), 8)] == [5, 6, 6]
    assert [p.n for p in pieces(rows_job(1, 16, 1), 8)] == [8, 8]
    assert [p.n for p in pieces(rows_job(1, 3, 1), 1)] == [1, 1, 1]


async def _split_cancel() -> None:
    p, conn = pool()
    p.costs.rates["m", "saliency"] = 1.0
    big = p.submit(rows_job(1, 40, 12))
    assert len(big.parts) == 5 and len(conn.sent) == 1
    p.cancel(big)
    assert big.future.cancelled() and p.queue_depth() == 0
    assert conn.cancelled == [big.parts[0].work.id]  # the piece computing is told to stop


def test_cancelling_a_split_request_cancels_every_piece() -> None:
    asyncio.run(_split_cancel())


async def _pieces_count_once() -> None:
    p, conn = pool(queue_size=2)
    p.costs.rates["m", "saliency"] = 1.0
    big = p.submit(rows_job(1, 40, 12))  # five pieces: one computing, four waiting
    assert len(big.parts) == 5 and p.queue_depth() == 1
    cheap = p.submit(job(2, key=None))  # admitted: one request waits, not four
    assert p.queue_depth() == 2
    with pytest.raises(QueueFull) as full:
        p.submit(job(3, key=None))
    # Retry-After from the backlog: 4 pieces of 96 ms and 1 ms, rounded up to a second
    assert full.value.headers == {"Retry-After": "1"}
    answer(p, conn.sent[0])
    answer(p, conn.sent[1])
    assert cheap.future.done()  # served after one piece


def test_a_split_request_counts_once_against_the_queue() -> None:
    asyncio.run(_pieces_count_once())


async def _backlog() -> None:
    p, conn = pool(max_backlog_s=0.5, retry_after_s=0)
    p.costs.rates["m", "saliency"] = 1.0
    huge = p.submit(rows_job(1, 10, 400))  # 4 s on an idle server: admitted, split
    assert len(huge.parts) == 10 and p.backlog_ms() == 3600.0  # 9 pieces of 400 ms wait
    p.cancel(huge)  # its piece computing is told to stop; the rest leave the queue
    p.submit(rows_job(2, 10, 40))  # 400 ms, all queued behind the stopping piece
    p.submit(rows_job(3, 10, 40))  # 400 ms queued, under 500: admitted
    assert p.backlog_ms() == 800.0
    hurried = dataclasses.replace(rows_job(4, 10, 40), deadline=time.time() + 0.2)
    with pytest.raises(QueueFull) as refused:
        p.submit(hurried)  # 800 ms queued, over 500 (and over what its deadline leaves)
    assert refused.value.headers == {"Retry-After": "1"}  # 300 ms, rounded up
    assert "backlog limit of 0.5 s" in refused.value.detail
    assert "attribution-jobs" in refused.value.detail
    # a request that says it will wait (its own 60 s deadline) waits behind the 800 ms
    patient = p.submit(rows_job(6, 10, 40))
    assert not patient.future.done() and p.backlog_ms() == 1200.0
    cheap = p.submit(job(5, key=None))  # cheap work is never refused by the backlog
    answer(p, conn.sent[-1])
    assert [j.id for j in conn.sent[-1].works] == [5] and not cheap.future.done()
    answer(p, conn.sent[-1])
    assert cheap.future.done()
    unlimited, _ = pool(max_backlog_s=0)
    unlimited.costs.rates["m", "saliency"] = 1.0
    for i in range(3):
        unlimited.submit(rows_job(i, 10, 400))


def test_an_expensive_request_is_refused_by_the_backlog_it_would_join() -> None:
    asyncio.run(_backlog())


async def _split_predictions() -> None:
    p, conn = pool()
    p.costs.rates["m", Prediction.label] = 10.0
    rows = rows_job(1, 6, 10)
    predict = Prediction(
        id=1, model_id="m", arrays=rows.arrays, n=6, cost=60, key=("k",), deadline=rows.deadline
    )
    whole = p.submit(predict)  # 100 ms each
    assert len(whole.parts) == 6
    for _ in range(6):
        (piece,) = conn.sent[-1].works
        reply = Reply(work_id=piece.id, predictions=piece.arrays[0] + 1, compute_ms=100.0)
        p._on_message(p.workers[0], 1, Replied(conn.sent[-1].id, [reply]))
    await asyncio.sleep(0)
    predictions = whole.future.result().predictions
    assert predictions is not None
    np.testing.assert_array_equal(predictions[:, 0], np.arange(6) + 1)


def test_predictions_split_and_join_too() -> None:
    asyncio.run(_split_predictions())


async def _merge_cap() -> None:
    p, conn = pool()
    p.submit(job(1, key=None))  # computing
    p.costs.rates["m", "saliency"] = 1.0  # ms per forward row: a piece is 100 rows
    for i in (2, 3, 4):
        p.submit(rows_job(i, 1, 60))  # mergeable, 60 ms each
    # merging stops at about one piece of compute (two would be 120 ms); [2], sealed so, waits
    # in the ready slot
    assert [[j.id for j in b.works] for b in conn.sent] == [[1], [2]]
    assert [[e.work.id for e in pending.entries] for pending in p._waiting] == [[3], [4]]
    for i in (5, 6):
        p.submit(rows_job(i, 1, 30))  # 30 ms each: 5 joins 4 (90 ms), 6 would pass the piece
    assert [[e.work.id for e in pending.entries] for pending in p._waiting] == [[3], [4, 5], [6]]


def test_merging_stops_at_one_piece_of_compute() -> None:
    asyncio.run(_merge_cap())


async def _preempt_behind() -> None:
    p, conn = pool()
    chunk = p.submit(dataclasses.replace(job(1, key=None), background=True))  # a job's chunk
    assert [[j.id for j in b.works] for b in conn.sent] == [[1]] and conn.cancelled == []
    p.submit(job(2, key=None))  # sealed: waits in the ready slot, not in the queue
    assert [[j.id for j in b.works] for b in conn.sent] == [[1], [2]]
    assert conn.cancelled == [1]  # the chunk is stopped for it all the same
    assert chunk.pending is not None and chunk.pending.preempted


def test_a_job_chunk_is_preempted_for_work_in_the_ready_slot() -> None:
    asyncio.run(_preempt_behind())


async def _threads() -> None:
    p, conn = pool()
    other = Worker(99)  # another group's worker
    p.cores = Cores(4, None, lambda: [*p.workers, other])

    def run(i: int, compute_ms: float, method: str = "saliency") -> int:
        p.submit(dataclasses.replace(job(i, key=None), method=method))
        answer(p, conn.sent[-1], compute_ms=compute_ms)
        return conn.sent[-1].threads

    assert run(1, 50.0) == 1  # its cost unknown: one thread
    assert run(2, 20.0) == 4  # 50 ms: more threads are tried first, on every core...
    assert run(3, 50.0) == 1  # ...then one...
    assert run(4, 20.0) == 4  # ...and the faster kept
    other.outstanding.append(Pending(0, [], 1, None, threads=2))  # it computes on two
    other.outstanding.append(Pending(1, [], 1, None, threads=4))  # behind: not counted
    assert run(5, 20.0) == 2  # the cores left
    other.outstanding.clear()
    # a model whose ops are too small to split: one thread once both were measured
    assert [run(i, ms, "ig") for i, ms in [(7, 9.0), (8, 10.0), (9, 9.0), (10, 9.0)]] == [
        1,
        4,
        1,
        1,
    ]
    # every RETRY-th big batch measures the other way
    threads = [run(i, 9.0, "ig") for i in range(11, 11 + RETRY)]
    assert sorted(threads) == [1] * (RETRY - 1) + [4]
    # a heavy batch (HEAVY_MS) is never tried on one thread: every free core, each time
    p.costs.rates["m", "vit"] = 2 * HEAVY_MS
    assert [run(i, 2 * HEAVY_MS, "vit") for i in range(20, 20 + RETRY + 2)] == [4] * (RETRY + 2)
    p.costs.rates["m", "saliency"] = 0.5  # a batch of 0.5 ms: one thread, cores free or not
    assert run(40, 0.5) == 1
    p.cores = Cores(4, 2, lambda: p.workers)  # ATTRSERVE_TORCH_THREADS: fixed
    assert run(41, 0.5) == 2 and run(42, 50.0) == 2


def test_threads_follow_the_work() -> None:
    """A batch computes on one thread when it is small, its cost unknown, or more threads
    measured no faster on its model and method; else on every core no other worker's running
    batch holds (at least one)."""
    asyncio.run(_threads())


def test_the_forkserver_imports_what_the_models_sources_say(tmp_path: Path) -> None:
    """A Hugging Face model's workers fork with transformers and its architecture's module
    already imported (each imported them alone: ~5 s apiece); built-in models add nothing."""
    import multiprocessing.forkserver as mpf

    from model_registry import sources
    from service.pool.processes import PRELOAD, start_method
    from tests.hf_dirs import vit_dir

    vit_dir(tmp_path / "vit")
    (tmp_path / "models.toml").write_text(
        '[[models]]\nid = "vit"\nsource = "hf:vit"\n\n'
        '[[models]]\nid = "mlp"\nsource = "builtin:tabular-mlp"\n'
    )
    specs = model_registry.load_specs(tmp_path / "models.toml")
    _, mlp = specs
    assert sources.preload([mlp]) == []
    assert sources.preload(specs) == ["transformers", "transformers.models.vit.modeling_vit"]
    start_method(specs)
    assert mpf._forkserver._preload_modules == PRELOAD  # what the forkserver imports at start
    # ... service.worker.preload among them, which imports what the environment lists
    assert {"transformers", "transformers.models.vit.modeling_vit"} <= set(preload.declared())


def test_a_preload_module_that_fails_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """multiprocessing's own preload stops the forkserver on anything but ImportError: a model
    library that fails at import (built for another torch) would take every worker with it."""
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('built for torch 1.0')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert preload.preload(["broken_at_import", "json", "no_such_module"]) == ["json"]


async def _thread_worker(tmp: Path) -> None:
    (tmp / "models.toml").write_text('[[models]]\nid = "m"\nsource = "builtin:tabular-mlp"\n')
    specs = model_registry.load_specs(str(tmp / "models.toml"))
    settings = Settings(worker_mode="thread", worker_timeout_s=2, torch_threads=1)
    g = Group("g", settings, specs, Telemetry(), range(1))
    await g.start()
    try:
        w = g.workers[0]

        async def served() -> Reply:
            end = time.monotonic() + 60
            while w.state != "ready" and time.monotonic() < end:
                await asyncio.sleep(0.02)
            work = dataclasses.replace(
                job(1),
                arrays=(np.ones((2, 8), np.float32),),
                target={"form": "index", "index": [0]},
            )
            return await asyncio.wait_for(g.submit(work).future, 60)

        first = await served()
        assert first.error is None and first.attributions[0].shape == (2, 8)
        assert w.pid == os.getpid() and isinstance(w.process, WorkerThread)
        thread = w.process
        g._kill(w, "a test")  # a thread cannot be killed: its channel is shut, it ends
        await asyncio.to_thread(thread.join, 10)
        assert not thread.is_alive()
        again = await served()  # a new thread, the model loaded again
        assert w.restarts == 1 and w.process is not thread
        assert again.error is None and np.array_equal(again.attributions[0], first.attributions[0])
    finally:
        await g.stop()
    assert not w.process.is_alive()


def test_a_worker_thread_serves_ends_when_killed_and_restarts(tmp_path: Path) -> None:
    """worker_mode=thread (service.pool.inthread): the group's path with no process; kill
    shuts the thread's channel, so it ends, and a new thread serves; stop ends it."""
    asyncio.run(_thread_worker(tmp_path))
