"""Serving attributions: validate a request against its model, queue it, shape the answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from methods.errors import AttributionError
from methods.noise_tunnel import parse_noise_tunnel
from methods.params import MethodParams, parse_params
from methods.registry import CostShape, MethodSpec
from model_registry.spec import ModelSpec
from service.core.errors import (
    DeadlineExceeded,
    InvalidRequest,
    LimitExceeded,
    RequestCancelled,
    ServiceError,
    from_engine,
)
from service.core.offload import offload as in_thread
from service.core.settings import Settings
from service.core.work import Job, Reply, new_id
from service.kinds import causal_lm as generation
from service.kinds import exported
from service.pool.pool import Entry, WorkerPool
from service.serving import pictures, support
from service.wire import codec
from service.wire.attributions import AttributionRequest
from service.wire.targets import resolve_target
from service.worker.merge import merge_key

#: characters a text may hold per allowed token before it is refused unread (long words)
MAX_CHARS_PER_TOKEN = 32


def decode_params(ms: MethodSpec, raw: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Method params with tensor-valued ones decoded (nested lists or base64, or one per input)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        loc = ("body", "params", name)
        if name in ms.tensor_params and value is not None and not isinstance(value, (int, float)):
            if isinstance(value, list) and value and any(map(codec.is_tensor_object, value)):
                value = tuple(
                    codec.decode_tensor(v, (*loc, i), settings.max_tensor_elements)
                    for i, v in enumerate(value)
                )
            else:
                value = codec.decode_tensor(value, loc, settings.max_tensor_elements)
        out[name] = value
    return out


def validate_params(ms: MethodSpec, raw: dict[str, Any]) -> MethodParams:
    """The method's params model over the request's params: coerced, defaults filled in."""
    try:
        return parse_params(ms.params, ms.name, raw)
    except AttributionError as exc:
        raise from_engine(exc) from None


def check_limits(ms: MethodSpec, p: MethodParams, settings: Settings) -> None:
    """Step and sample limits, on the values after coercion (n_steps="auto": its ladder top)."""
    caps = {"steps": settings.max_n_steps, "samples": settings.max_n_samples}
    for name, kind in ms.limits.items():
        value = ms.limit_value(p, name)
        if value is not None and value > caps[kind]:
            given = getattr(p, name)
            shown = f"{given!r} (up to {value} steps)" if given != value else str(value)
            raise LimitExceeded(
                f"{name} {shown} is over this server's limit of {caps[kind]}",
                loc=("body", "params", name),
            )


def noise_tunnel(raw: dict[str, Any] | None, settings: Settings) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        nt = parse_noise_tunnel(raw)
    except AttributionError as exc:
        raise from_engine(exc) from None
    if nt.nt_samples > settings.max_n_samples:
        raise LimitExceeded(
            f"nt_samples {nt.nt_samples} is over this server's limit of {settings.max_n_samples}",
            loc=("body", "noise_tunnel", "nt_samples"),
        )
    return {name: getattr(nt, name) for name in nt.model_fields_set}


def check_texts(texts: tuple[str, ...], settings: Settings) -> int:
    """Per-text token cap before any work (each word is at least one token); the longest."""
    longest = 0
    cap = settings.max_text_tokens
    for i, text in enumerate(texts):
        words = len(text.split())
        if words > cap or len(text) > cap * MAX_CHARS_PER_TOKEN:
            raise LimitExceeded(
                f"text {i} is {len(text)} characters ({words} words); this server takes at most "
                f"{cap} tokens per text",
                loc=("body", "inputs", i),
            )
        longest = max(longest, words)
    return max(1, longest)


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


def build_job(
    settings: Settings,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline: float,
    request_id: str = "",
) -> Job:
    """Every check that needs no model: the request as a job, or a 4xx ServiceError."""
    plan = support.plan(spec, req.method, req.params)
    ms = plan.method
    raw = decode_params(ms, plan.params, settings)
    p = validate_params(ms, raw)
    step = spec.exported
    if step is not None:  # the file's step is fixed: the request may only restate it
        exported.check_fields(req)
        p = exported.effective_params(ms, step, p)
    check_limits(ms, p, settings)
    if req.verify and (ms.stochastic or req.noise_tunnel is not None):
        raise InvalidRequest(
            f"{ms.name}{' with a noise tunnel' if req.noise_tunnel else ''} draws random "
            "samples in the working dtype, so a float64 reference would draw different ones; "
            "verify a deterministic method",
            loc=("body", "verify"),
        )
    # what the worker passes on: the validated values of the params that were given
    params = {} if step else {name: getattr(p, name) for name in p.model_fields_set}
    if plan.attributed_layer is not None and req.noise_tunnel is not None:
        raise support.UnsupportedMethod(
            "noise_tunnel adds noise to the inputs, which are token ids on this model",
            loc=("body", "noise_tunnel"),
        )
    nt = noise_tunnel(req.noise_tunnel, settings)
    inputs = codec.decode_inputs(
        req.inputs, spec, settings.max_tensor_elements, settings.max_batch_size
    )
    if inputs.texts:
        shapes: tuple[tuple[int, ...], ...] = ((check_texts(inputs.texts, settings),),)
    else:
        shapes = tuple(tuple(int(d) for d in a.shape[1:]) for a in inputs.arrays)
    if req.render is not None:  # before the work: examples in range, a known colormap
        pictures.examples(req.render, inputs.n, len(spec.inputs))
    if step is not None:
        target = exported.target(spec, req.target, inputs.n)
    elif req.target is None and not ms.needs_target:
        target = None
    else:
        target = resolve_target(req.target, spec.output, inputs.n)
    baselines = codec.decode_baselines(req.baselines, spec, inputs, settings.max_tensor_elements)
    n_base = 1
    if isinstance(baselines, tuple) and baselines and isinstance(baselines[0], np.ndarray):
        n_base = int(baselines[0].shape[0])
    rows = ms.cost(p, CostShape(shapes, n_base, req.return_convergence_delta))
    if nt is not None:
        rows *= int(nt.get("nt_samples", 5))
    est = rows * inputs.n
    if est > settings.max_cost:
        raise LimitExceeded(
            f"this request would cost about {est} forward rows ({inputs.n} examples x {rows}); "
            f"the limit is {settings.max_cost}: send fewer examples, steps or samples",
            loc=("body",),
        )
    job = Job(
        id=new_id(),
        model_id=spec.id,
        method=ms.name,
        arrays=inputs.arrays,
        texts=inputs.texts,
        target=target,
        baselines=baselines,
        params=params,
        internal_batch_size=None
        if step
        else _batch_size(
            "internal_batch_size",
            req.internal_batch_size,
            spec.internal_batch_size,
            settings.internal_batch_size,
            settings.max_internal_batch_size,
        ),
        perturbations_per_eval=None
        if step
        else _batch_size(
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
        request_id=request_id,
        max_tokens=settings.max_text_tokens,
        verify=req.verify,
    )
    job.key = merge_key(job, ms, p)
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
    if reply.verification is not None:
        body["verification"] = reply.verification
    return body


async def wait(
    pool: WorkerPool,
    entry: Entry,
    timeout: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
) -> Reply:
    """The reply, or cancel the work when the deadline passes (504) or the client goes (499)."""
    watcher = asyncio.ensure_future(disconnected()) if disconnected is not None else None
    waits: set[asyncio.Future[Any]] = {entry.future} if watcher is None else {entry.future, watcher}
    try:
        await asyncio.wait(waits, timeout=max(0.0, timeout), return_when=asyncio.FIRST_COMPLETED)
    finally:
        if watcher is not None:
            watcher.cancel()
    if entry.future.done():
        return entry.future.result()
    pool.cancel(entry)
    if watcher is not None and watcher.done() and not watcher.cancelled():
        raise RequestCancelled("the client closed the connection; the work was stopped")
    raise DeadlineExceeded("the request did not finish within its deadline; the work was stopped")


def budget_ms(settings: Settings, *given: float | None) -> float:
    """The request's time budget: the first deadline given (header, body), else the default."""
    chosen = next((g for g in given if g), settings.deadline_ms)
    return min(chosen, settings.max_deadline_ms)


async def run(
    pool: WorkerPool,
    job: Job,
    budget: float,
    started: float,
    disconnected: Callable[[], Awaitable[Any]] | None,
) -> tuple[Reply, float]:
    """Queue the job and wait for it (cancelled at the deadline or when the client goes);
    the reply and the time it queued (ms)."""
    entry = pool.submit(job)
    remaining = budget / 1e3 - (time.perf_counter() - started)
    try:
        reply = await wait(pool, entry, remaining, disconnected)
    except DeadlineExceeded:
        raise DeadlineExceeded(
            f"the request did not finish within its deadline of {budget:g} ms; the work was stopped"
        ) from None
    if reply.error is not None:
        raise ServiceError.from_data(reply.error)
    queue_ms = 0.0
    if reply.compute_ms:
        queue_ms = max(0.0, (time.perf_counter() - started) * 1e3 - reply.compute_ms)
    return reply, queue_ms


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
) -> tuple[dict[str, Any], Job, Reply]:
    """Validate, queue, wait, answer. ``offload``: a large request, decoded in a thread so the
    event loop keeps serving others (health checks above all) meanwhile. ``predictions``: the
    reply also carries the model's whole output per example (KServe and OIP explain)."""
    budget = budget_ms(settings, deadline_ms, req.deadline_ms)
    deadline = time.time() + budget / 1e3
    if predictions:
        exported.not_for_predictions(spec)
    if generation.is_causal_lm(spec):
        if req.verify:
            raise InvalidRequest(
                "verify compares tensor attributions; causal language models are not covered",
                loc=("body", "verify"),
            )
        if predictions:
            raise InvalidRequest("predictions are not available for causal language models")
        job = generation.build_job(settings, spec, req, deadline, request_id)
        if req.render is not None:
            pictures.examples(req.render, 1)
        reply, queue_ms = await run(pool, job, budget, started, disconnected)
        body = generation.response(spec, req, job, reply, queue_ms, started)
        if req.render is not None:  # the prompt's features highlighted by seq_attr
            drawn = generation.for_render(reply)
            title = f"{spec.id} · {body['method']}"
            body["renders"] = await asyncio.to_thread(
                pictures.draw, req.render, spec, job, drawn, title
            )
        return body, job, reply
    if offload:
        job = await in_thread(build_job, settings, spec, req, deadline, request_id)
    else:
        job = build_job(settings, spec, req, deadline, request_id)
    job.predictions = predictions
    reply, queue_ms = await run(pool, job, budget, started, disconnected)
    body = response(spec, req, job, reply, queue_ms, started)
    if req.render is not None:  # PNG encoding takes milliseconds: off the event loop
        title = f"{spec.id} · {job.method}"
        body["renders"] = await asyncio.to_thread(
            pictures.draw, req.render, spec, job, reply, title
        )
    return body, job, reply
