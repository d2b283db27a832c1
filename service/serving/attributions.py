"""Serving attributions: validate a request against its model, queue it, shape the answer."""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from typing import Any

import numpy as np
from pydantic import BaseModel

from model_registry.spec import ModelSpec
from service import codec, cost, support
from service.errors import DeadlineExceeded, LimitExceeded, ServiceError
from service.pool.jobs import Job, Reply
from service.pool.merge import merge_key
from service.pool.pool import WorkerPool
from service.protocol.attributions import AttributionRequest
from service.settings import Settings
from service.targets import resolve_target

_ids = itertools.count(1)
SAMPLE_PARAMS = ("n_samples", "nt_samples")


def _is_tensor_param(schema: dict[str, Any]) -> bool:
    return any("b64" in (s.get("properties") or {}) for s in schema.get("anyOf", ()))


@functools.cache
def params_schema(params_model: type[BaseModel]) -> dict[str, Any]:
    """A method's params JSON schema, built once (pydantic takes ~1 ms to build it)."""
    schema: dict[str, Any] = params_model.model_json_schema()
    return schema


def decode_params(
    raw: dict[str, Any], schema: dict[str, Any], settings: Settings
) -> dict[str, Any]:
    """Method params with tensor-valued ones decoded, and the step/sample limits applied."""
    props = schema.get("properties", {})
    out: dict[str, Any] = {}
    for name, value in raw.items():
        loc = ("body", "params", name)
        if name in props and _is_tensor_param(props[name]) and value is not None:
            if (
                isinstance(value, list)
                and value
                and all(codec.is_tensor_object(v) or isinstance(v, list) for v in value)
                and any(codec.is_tensor_object(v) for v in value)
            ):
                value = tuple(
                    codec.decode_tensor(v, (*loc, i), settings.max_tensor_elements)
                    for i, v in enumerate(value)
                )
            elif not isinstance(value, (int, float)):
                value = codec.decode_tensor(value, loc, settings.max_tensor_elements)
        out[name] = value
    steps = out.get("n_steps")
    if isinstance(steps, int) and steps > settings.max_n_steps:
        raise LimitExceeded(
            f"n_steps {steps} is over the limit {settings.max_n_steps}",
            loc=("body", "params", "n_steps"),
        )
    samples = out.get("n_samples")
    if isinstance(samples, int) and samples > settings.max_n_samples:
        raise LimitExceeded(
            f"n_samples {samples} is over the limit {settings.max_n_samples}",
            loc=("body", "params", "n_samples"),
        )
    return out


def _batch_size(
    name: str,
    requested: int | str | None,
    model_default: int | str | None,
    server_default: int | str | None,
    cap: int,
) -> int | str | None:
    if isinstance(requested, int) and requested > cap:
        raise LimitExceeded(
            f"{name} {requested} is over the server's cap {cap}", loc=("body", name)
        )
    if requested is not None:
        return requested
    return model_default if model_default is not None else server_default


def build_job(settings: Settings, spec: ModelSpec, req: AttributionRequest, deadline: float) -> Job:
    """Every check that needs no model: the request as a job, or a 4xx ServiceError."""
    plan = support.plan(spec, req.method, req.params)
    ms = plan.method
    params = decode_params(req.params, params_schema(ms.params), settings)
    if plan.post_abs:
        params.pop("abs", None)
        params.setdefault("multiply_by_inputs", False)
    if plan.attributed_layer is not None and req.noise_tunnel is not None:
        raise support.UnsupportedMethod(
            "noise_tunnel adds noise to the inputs, which are token ids on this model",
            loc=("body", "noise_tunnel"),
        )
    nt = req.noise_tunnel
    if (
        nt is not None
        and isinstance(nt.get("nt_samples"), int)
        and (nt["nt_samples"] > settings.max_n_samples)
    ):
        raise LimitExceeded(
            f"nt_samples {nt['nt_samples']} is over the limit {settings.max_n_samples}",
            loc=("body", "noise_tunnel", "nt_samples"),
        )
    inputs = codec.decode_inputs(
        req.inputs, spec, settings.max_tensor_elements, settings.max_batch_size
    )
    target = resolve_target(req.target, spec.output, inputs.n)
    baselines = codec.decode_baselines(req.baselines, spec, inputs, settings.max_tensor_elements)
    n_base = 1
    if isinstance(baselines, tuple) and baselines and isinstance(baselines[0], np.ndarray):
        n_base = int(baselines[0].shape[0])
    rows = cost.per_example(
        ms.name, params, inputs.arrays, nt, req.return_convergence_delta, n_base
    )
    est = rows * inputs.n
    if est > settings.max_cost:
        raise LimitExceeded(
            f"this request would cost about {est} forward rows ({inputs.n} examples x {rows}); "
            f"the limit is {settings.max_cost}: send fewer examples, steps or samples",
            loc=("body",),
        )
    job = Job(
        id=next(_ids),
        model_id=spec.id,
        method=ms.name,
        arrays=inputs.arrays,
        texts=inputs.texts,
        target=target,
        baselines=baselines,
        params=params,
        internal_batch_size=_batch_size(
            "internal_batch_size",
            req.internal_batch_size,
            spec.internal_batch_size,
            settings.internal_batch_size,
            settings.max_internal_batch_size,
        ),
        perturbations_per_eval=_batch_size(
            "perturbations_per_eval",
            req.perturbations_per_eval,
            spec.perturbations_per_eval,
            settings.perturbations_per_eval,
            settings.max_perturbations_per_eval,
        ),
        noise_tunnel=nt,
        seed=req.seed,
        return_delta=req.return_convergence_delta,
        deadline=deadline,
        n=inputs.n,
        cost=est,
        attributed_layer=plan.attributed_layer,
        post_abs=plan.post_abs,
    )
    job.key = merge_key(job, ms.stochastic)
    return job


def _tensors(parts: list[np.ndarray], as_tuple: bool, encoding: str) -> Any:
    enc = [codec.encode_tensor(p, encoding) for p in parts]
    return enc if as_tuple else enc[0]


def response(
    spec: ModelSpec,
    req: AttributionRequest,
    job: Job,
    reply: Reply,
    queue_ms: float,
    started: float,
) -> dict[str, Any]:
    enc = req.output_encoding
    body: dict[str, Any] = {
        "model_id": spec.id,
        "model_version": spec.version,
        "method": job.method,
        "attributions": _tensors(reply.attributions, reply.as_tuple, enc),
        "convergence_delta": None if reply.delta is None else codec.encode_tensor(reply.delta, enc),
        "target": reply.target,
        "outputs": None if reply.outputs is None else codec.encode_tensor(reply.outputs, enc),
        "params": reply.params,
        "merged_requests": reply.merged,
        "timing_ms": {
            "queue": round(queue_ms, 3),
            "compute": round(reply.compute_ms, 3),
            "total": round((time.perf_counter() - started) * 1e3, 3),
        },
    }
    if job.attributed_layer is not None:
        body["requested_method"] = req.method
        body["attributed_layer"] = job.attributed_layer
    if reply.tokens is not None:
        body["tokens"] = reply.tokens
    return body


async def attribute(
    settings: Settings,
    pool: WorkerPool,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline_ms: float | None,
    started: float,
) -> tuple[dict[str, Any], Job]:
    budget = min(deadline_ms or req.deadline_ms or settings.deadline_ms, settings.max_deadline_ms)
    job = build_job(settings, spec, req, time.time() + budget / 1e3)
    future = pool.submit(job)
    remaining = budget / 1e3 - (time.perf_counter() - started)
    try:
        reply = await asyncio.wait_for(asyncio.shield(future), max(0.0, remaining))
    except TimeoutError:
        future.cancel()
        raise DeadlineExceeded(
            f"the request did not finish within its deadline of {budget:g} ms"
        ) from None
    if reply.error is not None:
        raise ServiceError.from_data(reply.error)
    queue_ms = 0.0
    if reply.compute_ms:
        queue_ms = max(0.0, (time.perf_counter() - started) * 1e3 - reply.compute_ms)
    return response(spec, req, job, reply, queue_ms, started), job
