"""``Accept: text/event-stream`` on a generative model's attributions route (CONTRACT 8.3): an
event ``token`` (``{"index", "token", "attr": [per feature]}``) as each answer token is
attributed, then ``result`` (the whole response body, as without a stream) or ``error`` (a
problem object). A client that hangs up cancels the rest of the work; so does the deadline,
after an ``error`` event.

Mistakes found before the work starts (the body, the method, limits, a full queue) are answered
as usual, with a status and a problem+json body: the stream opens only for work that runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service import kinds
from service.attributions.serving import build_job
from service.core.errors import DeadlineExceeded, InvalidRequest, RequestCancelled, ServiceError
from service.core.work import Generation
from service.http.problems import problem_body, to_service_error
from service.http.state import AppState
from service.kinds.base import timing
from service.serving.run import budget_ms
from service.wire.attributions import AttributionRequest

MEDIA_TYPE = "text/event-stream"


def wanted(accept: str | None) -> bool:
    """Whether the Accept header asks for an event stream."""
    if not accept:
        return False
    return any(part.split(";")[0].strip().lower() == MEDIA_TYPE for part in accept.split(","))


def sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def stream(
    state: AppState,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline_ms: float | None,
    started: float,
    request_id: str,
    path: str,
) -> StreamingResponse:
    """Queue the work with its events routed here, and stream them."""
    name = task_of(spec).family
    if not task_of(spec).streams:
        raise InvalidRequest(
            f"model {spec.id!r} ({name}) answers in one piece; an event stream (Accept: "
            "text/event-stream) is for generative language models (kinds causal_lm, seq2seq_lm)",
            loc=("header", "accept"),
        )
    if req.render is not None:
        raise InvalidRequest(
            "a stream carries no pictures; leave render out", loc=("body", "render")
        )
    if req.verify:
        raise InvalidRequest(
            "a stream sends each row as soon as it is known, so it cannot be checked against "
            "float32 and replaced; leave verify out, or ask without Accept: text/event-stream",
            loc=("body", "verify"),
        )
    settings, pool = state.settings, state.pool
    budget = budget_ms(settings, deadline_ms, req.deadline_ms)
    deadline = time.time() + budget / 1e3
    job = build_job(settings, spec, req, deadline, request_id)
    if not isinstance(job, Generation):
        raise TypeError("a generative model's work is a Generation")
    job.generation["stream"] = True
    job.verify = False  # a sampled check: a stream is not checked (its rows are already sent)
    events: asyncio.Queue[Any] = asyncio.Queue()
    submitted = time.perf_counter()
    entry = pool.submit(job)
    entry.on_event = events.put_nowait
    kind = kinds.of(spec)

    async def body() -> AsyncIterator[bytes]:
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait(
                    {getter, entry.future},
                    timeout=max(0.0, deadline - time.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if getter in done:
                    yield sse("token", getter.result())
                    continue
                getter.cancel()
                if not entry.future.done():  # the deadline
                    pool.cancel(entry)
                    late = DeadlineExceeded(
                        f"the request did not finish within its deadline of {budget:g} ms; "
                        "the work was stopped"
                    )
                    yield sse("error", problem_body(late, path))
                    return
                break
            while not events.empty():  # events come before the reply: all are here
                yield sse("token", events.get_nowait())
            failure: BaseException | None = (
                RequestCancelled("the work was cancelled")
                if entry.future.cancelled()
                else entry.future.exception()
            )
            if failure is not None:  # the worker lost, the model unloaded, ...: said, not raised
                err = (
                    to_service_error(failure)
                    if isinstance(failure, Exception)
                    else ServiceError("the work was stopped")
                )
                yield sse("error", problem_body(err, path))
                return
            reply = entry.future.result()
            if reply.error is not None:
                yield sse("error", problem_body(ServiceError.from_data(reply.error), path))
                return
            wait_ms = max(0.0, (time.perf_counter() - submitted) * 1e3 - reply.compute_ms)
            out = kind.response(spec, req, job, reply, timing(wait_ms, reply.compute_ms, started))
            yield sse("result", out)
        finally:  # the client went, or the server stops: the work stops too
            if not entry.future.done():
                pool.cancel(entry)

    return StreamingResponse(
        body(),
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
