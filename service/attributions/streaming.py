"""``Accept: text/event-stream`` on a generative model's attributions route (CONTRACT 8.3): an
event ``token`` (``{"index", "token", "attr": [per feature]}``) as each answer token is
attributed, then ``result`` (the whole response body, as without a stream) or ``error`` (a
problem object). A client that hangs up cancels the rest of the work; so does the deadline,
after an ``error`` event.

Mistakes found before the work starts (the body, the method, limits, a full queue) are answered
as usual, with a status and a problem+json body: the stream opens only for work that runs.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import StreamingResponse

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service.attributions.serving import ATTRIBUTIONS, build_work
from service.core.errors import InvalidRequest
from service.core.work import Generation, Reply
from service.http.state import AppState
from service.kinds.base import timing
from service.serving import capability
from service.serving.capability import Done, budget_ms
from service.wire.attributions import AttributionRequest

MEDIA_TYPE = "text/event-stream"


def wanted(accept: str | None) -> bool:
    """Whether the Accept header asks for an event stream."""
    if not accept:
        return False
    return any(part.split(";")[0].strip().lower() == MEDIA_TYPE for part in accept.split(","))


def sse(event: str, data: Any) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def check(spec: ModelSpec, req: AttributionRequest) -> None:
    """What a stream cannot do, refused before it opens (a status and a problem+json)."""
    if not task_of(spec).streams:
        raise InvalidRequest(
            f"model {spec.id!r} ({task_of(spec).family}) answers in one piece; an event "
            "stream (Accept: text/event-stream) is for generative language models (kinds "
            "causal_lm, seq2seq_lm)",
            loc=("header", "accept"),
        )
    if req.render is not None:
        raise InvalidRequest(
            "a stream carries no pictures; leave render out", loc=("body", "render")
        )
    if req.verify:
        raise InvalidRequest(
            "a stream sends each row as soon as it is known, so it cannot be checked "
            "against float32 and replaced; leave verify out, or ask without Accept: "
            "text/event-stream",
            loc=("body", "verify"),
        )


async def stream(
    state: AppState,
    model_id: str,
    request: Request,
    req: AttributionRequest,
    deadline_ms: float | None,
    request_id: str,
) -> StreamingResponse:
    """Queue the work with its events routed here, and stream them."""
    with ATTRIBUTIONS.observe(state, request.scope, model_id, req.method) as seen:
        spec = ATTRIBUTIONS.spec(state, model_id)
        check(spec, req)
        settings = state.settings
        budget = budget_ms(settings, deadline_ms, req.deadline_ms)
        deadline = time.time() + budget / 1e3
        work = build_work(settings, spec, req, deadline, request_id)
        if not isinstance(work, Generation):
            raise TypeError("a generative model's work is a Generation")
        work.generation["stream"] = True
        work.verify = False  # a sampled check: a stream is not checked (its rows are sent)
        options = ATTRIBUTIONS.options(req, work)
        started = seen.started

        def answer(reply: Reply, queued_ms: float) -> dict[str, Any]:
            timing_ms = timing(queued_ms, reply.compute_ms, started)
            return ATTRIBUTIONS.answer(Done(spec, work, reply, options, timing_ms))

        events = capability.stream(
            state.pool, work, deadline, budget, request.url.path, answer, sse
        )
        return StreamingResponse(
            events,
            media_type=MEDIA_TYPE,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
