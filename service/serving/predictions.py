"""Serving predictions: the model's outputs for inputs (KServe ``:predict``, OIP ``infer``),
through the same codec checks, worker pool, batching and cancellation as attributions."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from model_registry.spec import ModelSpec
from service.core.offload import offload as in_thread
from service.core.settings import Settings
from service.core.work import PREDICT, Job, Reply, new_id
from service.kinds import exported
from service.pool.pool import WorkerPool
from service.serving.attributions import budget_ms, check_texts, run
from service.wire import codec
from service.worker.merge import predict_key


def build_job(
    settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str = ""
) -> Job:
    """Every check that needs no model: the inputs as a prediction job, or a 4xx error."""
    exported.not_for_predictions(spec)
    decoded = codec.decode_inputs(
        inputs, spec, settings.max_tensor_elements, settings.max_batch_size
    )
    if decoded.texts:
        check_texts(decoded.texts, settings)
    job = Job(
        id=new_id(),
        model_id=spec.id,
        method=PREDICT,
        arrays=decoded.arrays,
        texts=decoded.texts,
        target=None,
        baselines=None,
        params={},
        internal_batch_size=None,
        perturbations_per_eval=None,
        noise_tunnel=None,
        seed=None,
        return_delta=False,
        deadline=deadline,
        n=decoded.n,
        cost=decoded.n,
        request_id=request_id,
        max_tokens=settings.max_text_tokens,
        predictions=True,
    )
    job.key = predict_key(job)
    return job


async def predict(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    inputs: Any,
    deadline_ms: float | None,
    started: float,
    request_id: str = "",
    disconnected: Callable[[], Awaitable[Any]] | None = None,
    offload: bool = False,
) -> Reply:
    """The model's outputs for ``inputs`` (any form the attributions route takes)."""
    budget = budget_ms(settings, deadline_ms)
    deadline = time.time() + budget / 1e3
    if offload:
        job = await in_thread(build_job, settings, spec, inputs, deadline, request_id)
    else:
        job = build_job(settings, spec, inputs, deadline, request_id)
    reply, _ = await run(pool, job, budget, started, disconnected)
    return reply
