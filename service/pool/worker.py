"""The worker process: load the models once, then serve batches until told to stop.

Loop: receive a batch -> drop expired jobs -> merge -> decode -> engine -> encode -> reply.
Errors go back as plain data; only a crash of the process itself loses a batch. A thread keeps
reading the pipe while a batch computes, so the parent can queue the next batch without
blocking on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

from model_registry.spec import ModelSpec
from service.errors import DeadlineExceeded, ServiceError, from_engine
from service.pool.jobs import Batch, Job, Reply
from service.pool.merge import merge, split


def worker_main(
    index: int, conn: Connection, specs: list[ModelSpec], options: dict[str, Any]
) -> None:
    """Process entry point (spawned)."""
    if options.get("cuda_device") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(options["cuda_device"])
    try:
        import methods
        import model_registry
        from service.pool import threads

        threads.limit(int(options.get("torch_threads") or 1))
        methods.set_memory_budget(int(options["memory_budget_bytes"]))
        models = {s.id: model_registry.load(s) for s in specs}
        for lm in models.values():
            _warm_up(lm)
    except BaseException as exc:  # report why, then exit: the parent decides on restarts
        conn.send(("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        return
    info = {
        mid: {
            "device": str(m.device),
            "tokenizer": m.tokenizer is not None,
            "torchscript": bool(m.is_torchscript),
        }
        for mid, m in models.items()
    }
    conn.send(("ready", {"pid": os.getpid(), "models": info}))
    from service.pool.compute import run_job

    inbox: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(conn, inbox), daemon=True).start()
    while True:
        batch = inbox.get()
        if batch is None:
            return
        conn.send(("done", batch.id, run_batch(models, batch.jobs, run_job)))


def _receive(conn: Connection, inbox: queue.SimpleQueue[Batch | None]) -> None:
    """Pipe -> inbox until the parent says stop (None) or goes away."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            msg = None
        inbox.put(msg)
        if msg is None:
            return


def _warm_up(lm: Any) -> None:
    """One tiny attribution per model, so the first request does not pay for lazy set-up."""
    import torch

    import methods

    spec = lm.spec
    xs = tuple(
        torch.zeros(
            [1 if d is None else d for d in (1, *i.shape[1:])],
            dtype=i.torch_dtype,
            device=lm.device,
        )
        for i in spec.inputs
    )
    method = "integrated_gradients"
    extra: dict[str, Any] = {"n_steps": 2}
    layer: dict[str, Any] = {}
    if spec.embedding_layer is not None and not xs[0].is_floating_point():
        method, layer = "layer_integrated_gradients", {"layer": spec.embedding_layer}
    target = 0 if spec.output.shape and spec.output.shape[0] not in (None, 1) else None
    with contextlib.suppress(Exception):  # best effort; real requests report real errors
        methods.attribute(
            lm.model, xs if len(xs) > 1 else xs[0], method, target=target, **extra, **layer
        )


def _error(job: Job, err: ServiceError) -> Reply:
    return Reply(job_id=job.id, error=err.to_data())


def _safe(run: Any, models: dict[str, Any], job: Job) -> Reply:
    try:
        reply: Reply = run(models[job.model_id], job)
        return reply
    except ServiceError as err:
        return _error(job, err)
    except Exception as exc:
        from methods.errors import AttributionError

        if isinstance(exc, AttributionError):
            return _error(job, from_engine(exc))
        return _error(job, ServiceError(f"internal error: {type(exc).__name__}: {exc}"))


def run_batch(models: dict[str, Any], jobs: list[Job], run: Any) -> list[Reply]:
    now = time.time()
    replies = [
        _error(j, DeadlineExceeded("the deadline passed before the work started"))
        for j in jobs
        if j.deadline <= now
    ]
    live = [j for j in jobs if j.deadline > now]
    if len(live) > 1:
        merged = _safe(run, models, merge(live))
        if merged.error is None:
            return replies + split(merged, live)
        # one bad request must not fail its companions: run them one by one
    for j in live:
        replies.append(_safe(run, models, j))
    return replies
