"""Attributions as a capability: the request's kind of model turns it into work, the template
runs it (``service.serving.capability``), the kind shapes the answer, and the pictures are
drawn off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from methods.engine import superpixels
from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service import kinds
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Reply, Work
from service.kinds.base import with_segments
from service.pool.pool import WorkerPool
from service.serving import pictures
from service.serving.capability import Capability, Done
from service.wire.attributions import AttributionRequest, AttributionResponse


def build_work(
    settings: Settings,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline: float,
    request_id: str = "",
) -> Work:
    """Every check that needs no model (the model's kind decides): the request as work, or a
    4xx ServiceError. The params a request leaves out take the model's models.toml
    ``defaults`` first."""
    kind = kinds.of(spec)
    if spec.defaults.get(req.method):
        params = kinds.with_defaults(spec, req.method, req.params)
        req = req.model_copy(update={"params": params})
    if req.metrics is not None and req.metrics.asked() and not kind.catalogue(spec).predicts:
        raise UnsupportedMethod(
            f"model {spec.id!r} is a {kind.name} model: its attributions cannot be scored "
            "with metrics (they need a tensor model's forward)",
            loc=("body", "metrics"),
        )
    work = kind.build_work(settings, spec, req, deadline, request_id)
    if req.render is not None:  # before the work: examples in range, a known colormap
        pictures.examples(req.render, work.n, kind.catalogue(spec).pictures)
    return work


class Attributions(Capability[AttributionRequest]):
    """``POST /v1/models/{model_id}/attributions``: one method on a batch of examples."""

    operation = "attributions"
    stem = "attribution"
    request = AttributionRequest
    response = AttributionResponse
    job_operation_id = "submitJob"
    job_summary = (
        "Queue the attributions request as a job (validated now, run in chunks, persisted)."
    )

    def method(self, req: AttributionRequest) -> str:
        return req.method

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        return build_work(settings, spec, req, deadline, request_id)

    def offloaded(self, spec: ModelSpec, req: AttributionRequest) -> bool:
        # large bodies (the route says), images (decoded and resized, milliseconds each) and
        # superpixels (scikit-image: tens of milliseconds an image, quickshift seconds)
        drawn = any(superpixels.is_spec(v) for v in req.params.values())
        return spec.images is not None or drawn

    def options(self, req: AttributionRequest, work: Work) -> dict[str, Any]:
        return {"encoding": req.output_encoding, "requested": req.method}

    def legacy_options(self, work: Work) -> dict[str, Any]:
        return {"encoding": "json", "requested": getattr(work, "requested", None)}

    def advice(self, settings: Settings, spec: ModelSpec, work: Work) -> str:
        if not task_of(spec).jobs:
            return ""
        return super().advice(settings, spec, work)

    def answer(self, done: Done) -> dict[str, Any]:
        kind = kinds.of(done.spec)
        encoding = "json" if done.job else done.options.get("encoding", "json")
        body = kind.response(
            done.spec, done.work, done.reply, done.timing_ms, encoding, done.options["requested"]
        )
        if done.job:
            body.pop("merged_requests", None)  # a job's chunks run alone
        return body

    async def finish(
        self, req: AttributionRequest, done: Done, body: dict[str, Any]
    ) -> dict[str, Any]:
        if req.render is not None:  # PNG encoding takes milliseconds: off the event loop
            kind = kinds.of(done.spec)
            title = f"{done.spec.id} · {body['method']}"
            drawn = kind.drawn(with_segments(done.work, done.reply))
            body["renders"] = await asyncio.to_thread(
                pictures.draw, req.render, done.spec, done.work, drawn, title
            )
        return body

    def check_job(self, spec: ModelSpec, req: AttributionRequest) -> None:
        if not task_of(spec).jobs:
            raise UnsupportedMethod(
                f"model {spec.id!r} is a {task_of(spec).family} model: attribution jobs run "
                f"tensor models; send its requests to POST /v1/models/{spec.id}/attributions",
                loc=("path", "model_id"),
            )
        super().check_job(spec, req)
        if req.metrics is not None and req.metrics.asked():
            raise InvalidRequest(
                "metrics are computed with synchronous answers (their noise is drawn for the "
                "request's batch, which a job cuts into chunks); POST the examples to "
                f"/v1/models/{spec.id}/attributions",
                loc=("body", "metrics"),
            )
        asked = req.precision if req.precision is not None else spec.precision
        if req.verify and asked in (None, spec.dtype):
            low = (
                ""
                if spec.remote is not None
                else '; a job verifies a low precision (e.g. "precision": "bfloat16") against '
                "float32, chunk by chunk"
            )
            raise InvalidRequest(
                "verify at the model's own dtype compares one synchronous answer with a float64 "
                f"CPU reference, which jobs do not return{low}",
                loc=("body", "verify"),
            )


ATTRIBUTIONS = Attributions()


async def attribute(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline_ms: float | None,
    started: float,
    request_id: str = "",
    disconnected: Callable[[], Awaitable[Any]] | None = None,
    offload: bool = False,
    predictions: bool = False,
) -> tuple[dict[str, Any], Work, Reply]:
    """The attributions answer on a model, without a route (KServe's and OIP's explain, the
    tests): validate, queue, wait, answer. ``offload``: a large request, decoded in a thread so
    the event loop keeps serving others. ``predictions``: the reply also carries the model's
    whole output per example."""
    kind = kinds.of(spec)
    if predictions and not kind.catalogue(spec).predicts:
        raise kind.no_predictions(spec)

    def asking(work: Work) -> None:
        if isinstance(work, Attribution):
            work.predictions = True

    done = await ATTRIBUTIONS.run(
        settings,
        pool,
        spec,
        req,
        started=started,
        deadline_ms=deadline_ms,
        request_id=request_id,
        disconnected=disconnected,
        offload=offload,
        adjust=asking if predictions else None,
    )
    body = await ATTRIBUTIONS.finish(req, done, ATTRIBUTIONS.answer(done))
    return body, done.work, with_segments(done.work, done.reply)
