"""The worker process: load the models once, then serve batches until told to stop.

Loop: receive a batch -> drop cancelled and expired jobs -> merge -> engine -> reply. Errors go
back as plain data; only a crash of the process itself loses a batch. Two threads run beside
the loop: one reads the channel while a batch computes (so the parent can queue the next batch
and cancel the running one at any time), one sends heartbeats, from the very start, so the
parent can tell a slow worker from a stopped one.

Cancellation: the engine calls ``methods.engine`` checkpoints between chunks; the running
batch's checkpoint says stop once every job in it is cancelled (by the parent: deadline passed
or client gone) or past its deadline, or the parent has gone away.

What crosses the channel: the dataclasses of ``service.worker.messages``.

In thread mode (``ATTRSERVE_WORKER_MODE=thread``, ``service.pool.inthread``) the same loop runs
in a thread of the server, over the same channel; what belongs to a process is then the
server's and left alone: logging, the visible GPUs, torch's thread counts (the batch's
``threads`` are not applied: the worker computes on the server process's threads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from model_registry.sources.remote import RemoteFailure
from model_registry.spec import ModelSpec
from service.core import events
from service.core.errors import (
    DeadlineExceeded,
    RequestCancelled,
    ServiceError,
    UpstreamFailed,
    UpstreamTimeout,
)
from service.core.work import Batch, Reply, Work
from service.wire.engine_errors import from_engine
from service.worker.channel import BlockingChannel
from service.worker.merge import merge, split
from service.worker.messages import (
    Cancel,
    Event,
    Heartbeat,
    Ready,
    Replied,
    StartFailed,
    Stop,
)

log = logging.getLogger("attrserve.worker")
Run = Callable[[Any, Work], Reply]
#: a running job's event to the parent: (job id, payload)
Send = Callable[[int, Any], None]
#: thread mode: one model loads at a time in the process (transformers builds a model with
#: torch patched process-wide: on the meta device, parameters registered empty)
LOADING = threading.Lock()


class Control:
    """What the channel thread tells the computing thread: cancelled jobs, and stop."""

    def __init__(self) -> None:
        self.cancelled: set[int] = set()
        self.stopping = False

    def should_stop(self, works: list[Work]) -> Callable[[], bool]:
        ids = [j.id for j in works]
        deadline = max(j.deadline for j in works)

        def check() -> bool:
            return self.stopping or time.time() > deadline or all(i in self.cancelled for i in ids)

        return check

    def forget(self, works: list[Work]) -> None:
        for j in works:
            self.cancelled.discard(j.id)


def load_problem(exc: Any) -> str:
    """A ``RegistryError`` as the reason a model did not load: its field and message (the
    model is named beside it)."""
    return f"field {exc.field!r}: {exc.detail}" if exc.field else str(exc.detail)


def worker_main(
    index: int, sock: socket.socket, specs: list[ModelSpec], options: dict[str, Any]
) -> None:
    """Process entry point (spawned); with ``options["in_thread"]``, a thread's of the server
    process (``service.pool.inthread``), which leaves the process's own state alone."""
    chan = BlockingChannel(sock)
    in_thread = bool(options.get("in_thread"))
    if not in_thread:
        level = logging.getLevelName(str(options.get("log_level", "info")).upper())
        logging.basicConfig(
            level=level if isinstance(level, int) else logging.INFO, format="%(message)s"
        )
    beat = threading.Thread(
        target=_heartbeat, args=(chan, float(options["heartbeat_s"])), daemon=True
    )
    beat.start()
    if options.get("cuda_device") is not None and not in_thread:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(options["cuda_device"])
    try:
        import methods
        import model_registry
        from service import kinds
        from service.worker import threads

        if not in_thread:
            threads.limit(int(options.get("torch_threads") or 1))
        budget = options["memory_budget_bytes"]
        methods.set_memory_budget(None if budget is None else int(budget))
    except BaseException as exc:  # report why, then exit: the parent decides on restarts
        log.error("attrserve: worker %d cannot start\n%s", index, traceback.format_exc())
        chan.send(StartFailed(f"{type(exc).__name__}: {exc}", {}))
        return
    # each model alone: one that cannot load (or fails its kind's set-up: compile, warm up,
    # checks) is reported with the reason, and the others are served
    models: dict[str, Any] = {}
    info: dict[str, dict[str, Any]] = {}
    failed: dict[str, str] = {}
    for spec in specs:
        try:
            with LOADING if in_thread else contextlib.nullcontext():
                lm = model_registry.load(spec)
                info[spec.id] = {
                    "device": str(lm.device),
                    "tokenizer": lm.tokenizer is not None,
                    "torchscript": bool(lm.is_torchscript),
                    **kinds.of(spec).prepare(lm),
                }
            models[spec.id] = lm
        except model_registry.RegistryError as exc:  # a configuration mistake: its message
            failed[spec.id] = load_problem(exc)  # names the field and the fix (the parent logs it)
        except Exception as exc:  # unexpected: the traceback helps
            log.error("attrserve: model %r failed to load\n%s", spec.id, traceback.format_exc())
            failed[spec.id] = f"{type(exc).__name__}: {exc}"
    if not models:
        chan.send(StartFailed("no model could be loaded", failed))
        return
    chan.send(Ready(os.getpid(), info, failed))

    control = Control()
    inbox: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
    threading.Thread(target=_receive, args=(chan, inbox, control), daemon=True).start()
    while True:
        batch = inbox.get()
        if batch is None:
            return
        if not in_thread:
            threads.use(batch.threads)
        replies = run_batch(
            models, batch.works, kinds.run, control, lambda jid, p: chan.send(Event(jid, p))
        )
        control.forget(batch.works)
        try:
            chan.send(Replied(batch.id, replies))
        except OSError:  # the parent is gone
            return


def _heartbeat(chan: BlockingChannel, interval: float) -> None:
    while True:
        time.sleep(interval)
        try:
            chan.send(Heartbeat())
        except OSError:
            return


def _receive(chan: BlockingChannel, inbox: queue.SimpleQueue[Batch | None], c: Control) -> None:
    """Channel -> inbox until the parent says stop or goes away; cancels at once."""
    while True:
        try:
            msg = chan.recv()
        except (EOFError, OSError):
            msg = Stop()
        match msg:
            case Batch():
                inbox.put(msg)
            case Cancel(work_ids):
                c.cancelled.update(work_ids)
            case Stop():
                c.stopping = True  # the batch computing now stops at its next checkpoint
                inbox.put(None)
                return
            case _:  # a bug of the parent's: said, and the worker goes on
                log.error("attrserve: not a message to a worker: %r", msg)


def _error(work: Work, err: ServiceError) -> Reply:
    return Reply(work_id=work.id, error=err.to_data())


def _ids(works: list[Work]) -> str:
    return ",".join(j.request_id for j in works)


def upstream(work: Work, exc: RemoteFailure) -> ServiceError:
    """A remote predictor's failure as the service answers it: 504 when it timed out, else
    502, naming the model (the message names the predictor and its status)."""
    log.warning("request %s: model %s: %s", work.request_id, work.model_id, exc)
    cls = UpstreamTimeout if exc.status == 504 else UpstreamFailed
    return cls(f"model {work.model_id!r}: {exc}", members={"upstream_status": exc.upstream})


def _safe(
    run: Run,
    models: dict[str, Any],
    work: Work,
    works: list[Work],
    c: Control,
    send: Send | None = None,
) -> Reply:
    """``run(job)`` under a cancel scope, its events (``service.core.events``) sent as
    ``Event`` messages; every failure as a reply (logged when unexpected)."""
    import methods
    from methods.errors import AttributionCancelled, AttributionError, ModelError

    emit = None if send is None else partial(send, work.id)
    try:
        with methods.cancel_scope(c.should_stop(works)), events.sink(emit):
            reply: Reply = run(models[work.model_id], work)
        return reply
    except ServiceError as err:
        return _error(work, err)
    except AttributionCancelled:
        if c.stopping:
            return _error(work, RequestCancelled("the server stopped the work"))
        if time.time() > work.deadline:
            return _error(work, DeadlineExceeded("the deadline passed; the work was stopped"))
        return _error(work, RequestCancelled("the request was cancelled; the work was stopped"))
    except RemoteFailure as exc:  # a prediction route calls the predictor directly
        return _error(work, upstream(work, exc))
    except ModelError as exc:
        if isinstance(exc.__cause__, RemoteFailure):  # the predictor's fault, not the model's
            return _error(work, upstream(work, exc.__cause__))
        # the model's own exception text may hold internals (allocator, paths): log it only
        log.error(
            "request %s: %s on %s failed in the model\n%s",
            _ids(works),
            work.name,
            work.model_id,
            traceback.format_exc(),
        )
        return _error(work, from_engine(exc, work.request_id))
    except AttributionError as exc:
        return _error(work, from_engine(exc, work.request_id))
    except Exception:
        log.error(
            "request %s: %s on %s failed\n%s",
            _ids(works),
            work.name,
            work.model_id,
            traceback.format_exc(),
        )
        return _error(work, ServiceError(f"internal error (request id {work.request_id})"))


def run_batch(
    models: dict[str, Any], works: list[Work], run: Run, c: Control, send: Send | None = None
) -> list[Reply]:
    now = time.time()
    replies: list[Reply] = []
    live: list[Work] = []
    for j in works:
        if j.id in c.cancelled:
            replies.append(_error(j, RequestCancelled("cancelled before the work started")))
        elif j.deadline <= now:
            replies.append(
                _error(j, DeadlineExceeded("the deadline passed before the work started"))
            )
        else:
            live.append(j)
    if len(live) > 1:
        merged = _safe(run, models, merge(live), live, c)
        if merged.error is None:
            return replies + split(merged, live)
        if merged.error["code"] in (RequestCancelled.code, DeadlineExceeded.code):
            return replies + [Reply(work_id=j.id, error=merged.error) for j in live]
        # one bad request must not fail its companions: run them one by one
    for j in live:
        replies.append(_safe(run, models, j, [j], c, send))
    return replies
