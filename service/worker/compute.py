"""One job on one loaded model: arrays -> tensors -> ``methods.attribute`` -> arrays."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

import methods
from methods import registry
from methods.cancel import checkpoint
from methods.errors import ModelError
from methods.verify import verify
from model_registry.spec import LoadedModel
from service.core.errors import InvalidRequest, LimitExceeded
from service.core.work import PREDICT, Job, Reply
from service.wire.targets import to_engine
from service.worker.prepare import disable_compiled, reference, serving_model, worth_eager_retry


def _tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def _convert(value: Any, device: torch.device) -> Any:
    if isinstance(value, np.ndarray):
        return _tensor(value, device)
    if isinstance(value, tuple):
        return tuple(_convert(v, device) for v in value)
    if isinstance(value, list):
        return [_convert(v, device) for v in value]
    return value


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().to("cpu")
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def _select(out: torch.Tensor, target: Any, n: int) -> torch.Tensor:
    """The model output at the engine target, one value per example."""
    if target is None:
        return out.reshape(n, -1)[:, 0]
    if isinstance(target, int):
        return out[:, target]
    if isinstance(target, tuple):
        return out[(slice(None), *target)]
    rows = torch.tensor(target, device=out.device)
    ar = torch.arange(n, device=out.device)
    if rows.dim() == 1:
        return out[ar, rows]
    return out[(ar, *rows.unbind(1))]


def _forward(lm: LoadedModel, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The model's output; its own failure reported as the engine reports one (a 422 that
    names the request id, the details in the log)."""
    compiled = lm.extra.get("compiled")
    try:
        with torch.no_grad():
            try:
                out = (lm.model if compiled is None else compiled)(*xs)
            except Exception as exc:
                if compiled is None or not worth_eager_retry(exc):
                    raise
                out = lm.model(*xs)  # the model's own failure, if it fails eagerly too
                disable_compiled(lm, exc, "on a request")
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise ModelError(
            f"the model raised {type(exc).__name__}: {exc}", argument="inputs"
        ) from exc
    if not isinstance(out, torch.Tensor):
        raise InvalidRequest("the model did not return one tensor", loc=("body", "target"))
    return out


def _inputs(lm: LoadedModel, job: Job) -> tuple[tuple[torch.Tensor, ...], list[list[str]] | None]:
    """The job's inputs as tensors on the model's device (texts through the tokenizer)."""
    if not job.texts:  # to the declared dtypes (bfloat16 travels as float32)
        specs = lm.spec.inputs
        return tuple(
            _tensor(a, lm.device).to(i.torch_dtype) for a, i in zip(job.arrays, specs, strict=True)
        ), None
    if lm.tokenizer is None:
        raise InvalidRequest(
            f"model {job.model_id!r} has no tokenizer; send token ids", loc=("body", "inputs")
        )
    ids, tokens = lm.tokenizer(list(job.texts))
    longest = max(len(t) for t in tokens) if tokens else 0
    if job.max_tokens is not None and longest > job.max_tokens:
        raise LimitExceeded(
            f"a text has {longest} tokens; this server takes at most {job.max_tokens}",
            loc=("body", "inputs"),
        )
    return (ids.to(lm.device),), tokens


def predict(lm: LoadedModel, job: Job) -> Reply:
    """The model's outputs for the job's inputs (one forward, no gradients)."""
    t0 = time.perf_counter()
    xs, tokens = _inputs(lm, job)
    checkpoint()
    out = _forward(lm, xs)
    return Reply(
        job_id=job.id,
        predictions=_numpy(out),
        tokens=tokens,
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


def run_exported(lm: LoadedModel, job: Job) -> Reply:
    """An ``attribution-export:`` model: the program's forward is the attribution."""
    t0 = time.perf_counter()
    step = lm.spec.exported
    xs, _ = _inputs(lm, job)
    n = int(xs[0].shape[0])
    args = xs
    if step is not None and step.per_example_target and job.target is not None:
        classes = torch.tensor(job.target["rows"], dtype=torch.int64, device=lm.device)
        args = (*xs, classes)
    checkpoint()
    try:
        with torch.no_grad():
            attrs = lm.model(*args)
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise ModelError(
            f"the program raised {type(exc).__name__}: {exc}", argument="inputs"
        ) from exc
    return Reply(
        job_id=job.id,
        attributions=[_numpy(p) for p in _flat(attrs)],
        as_tuple=isinstance(attrs, (tuple, list)),
        target=None if job.target is None else _rows(job.target, n),
        params=dict((step.params if step is not None else None) or {}),
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


def _attribute(lm: LoadedModel, model: Any, inputs: Any, job: Job, kwargs: dict[str, Any]) -> Any:
    """``methods.attribute`` (``methods.verify`` against the float64 CPU copy when the job
    asks): the result and the figures (None without verify)."""
    if job.verify:
        return verify(model, inputs, job.method, reference=reference(lm), **kwargs)
    return methods.attribute(model, inputs, job.method, **kwargs), None


def run_job(lm: LoadedModel, job: Job) -> Reply:
    if job.method == PREDICT:
        return predict(lm, job)
    if job.generation is not None:
        from service.worker.generation import run_generation

        return run_generation(lm, job)
    if lm.spec.exported is not None:
        return run_exported(lm, job)
    t0 = time.perf_counter()
    device = lm.device
    xs, tokens = _inputs(lm, job)
    n = int(xs[0].shape[0])
    out: torch.Tensor | None = None
    wire = job.target
    if job.predictions or (wire is not None and wire["kind"] == "predicted"):
        out = _forward(lm, xs)
    if wire is not None and wire["kind"] == "predicted" and out is not None:
        wire = {"kind": "per_example", "rows": out.argmax(dim=-1).tolist()}
    target = to_engine(wire)
    params = {k: _convert(v, device) for k, v in job.params.items()}
    if job.attributed_layer is not None:
        params["layer"] = job.attributed_layer
    kwargs: dict[str, Any] = {
        "target": target,
        "baselines": _convert(job.baselines, device),
        "internal_batch_size": job.internal_batch_size,
        "perturbations_per_eval": job.perturbations_per_eval,
        "noise_tunnel": job.noise_tunnel,
        "seed": job.seed,
        "return_convergence_delta": job.return_delta,
        **params,
    }
    inputs = xs if len(xs) > 1 else xs[0]
    model = serving_model(lm, registry.get(job.method))
    try:
        res, verification = _attribute(lm, model, inputs, job, kwargs)
    except Exception as exc:  # a compiled graph that fails on new shapes: eager from now on
        if model is lm.model or not worth_eager_retry(exc):
            raise
        res, verification = _attribute(lm, lm.model, inputs, job, kwargs)
        disable_compiled(lm, exc, "on a request")  # eager succeeded: the compiled graph failed
    attrs = res.attributions
    as_tuple = isinstance(attrs, tuple)
    parts = _flat(attrs)  # a nested layer output (an LSTM's out, (h, c)): depth first
    if job.attributed_layer is not None:  # one score per token: sum over the embedding dim
        parts = [(p.abs() if job.post_abs else p).sum(dim=-1) for p in parts]
    if res.outputs is not None and res.outputs.numel() == n:
        selected = res.outputs.reshape(n)
    else:
        selected = _select(out if out is not None else _forward(lm, xs), target, n)
    return Reply(
        job_id=job.id,
        attributions=[_numpy(p) for p in parts],
        as_tuple=as_tuple,
        delta=None if res.convergence_delta is None else _numpy(res.convergence_delta),
        outputs=_numpy(selected),
        target=None if wire is None else _rows(wire, n),
        tokens=tokens,
        params=res.params,
        predictions=None if not job.predictions or out is None else _numpy(out),
        compute_ms=(time.perf_counter() - t0) * 1e3,
        verification=None if verification is None else verification.as_dict(),
    )


def _flat(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _flat(v)]


def _rows(wire: dict[str, Any], n: int) -> list[Any]:
    if wire["kind"] == "index":
        idx = wire["index"]
        return [idx[0] if len(idx) == 1 else list(idx)] * n
    return list(wire["rows"])
