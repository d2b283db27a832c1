"""A tensor model's set-up in its worker, before the worker says ready: compile, warm up, check.

- ``compile = true``: hook-free methods run on ``torch.compile(model, dynamic=True, mode=...)``;
  methods that hook or intercept modules (``needs_hooks``, layer and neuron methods) keep the
  eager module. The compiled module is warmed up on probe batches of two sizes, so the first
  request pays no compilation and the batch dim is known dynamic; any failure (at compile,
  warm-up or a later call) falls back to eager with the reason logged and reported.
- ``verify_device`` (on by default off the CPU and for float16/bfloat16 models): a probe
  attribution on the serving path against the same attribution on a float64 CPU copy of the
  model (``methods.verify``); a disagreement beyond the dtype's tolerance leaves the model not
  ready, with the figures.

What the parent learns (``info``) travels in the worker's ready message.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

import methods
from methods import registry
from methods.engine import precision as precision_
from methods.verify import Verification, verify
from model_registry.sources import source_of
from model_registry.spec import LoadedModel
from service.kinds.runtime import disable_compiled, reference, serving_model
from service.kinds.tensors import vocabulary

log = logging.getLogger("attrserve.worker")

#: the probe's size of a free dim other than the batch (sequence lengths)
PROBE_LENGTH = 8
#: batch sizes of the compile warm-up (two, so the batch dim is compiled dynamic; not 1,
#: which torch specialises)
WARM_UP_BATCHES = (2, 3)
#: rows of the device check's probe
PROBE_BATCH = 2
#: quadrature steps of the probe's integrated gradients
PROBE_STEPS = 8
#: the precision probe's size of a free dim (long enough for the speeds to mean something)
AUTO_PROBE_LENGTH = 64
#: dtypes checked by default even on the CPU
LOW_PRECISION = ("float16", "bfloat16")


def prepare(lm: LoadedModel) -> dict[str, Any]:
    """Compile (if asked), warm up and check ``lm``; what the parent reports of it."""
    spec = lm.spec
    info: dict[str, Any] = {"compiled": False, "compile_error": None}
    source = source_of(spec)
    if source is not None and not source.local:  # its forward is a call elsewhere
        return {**info, "verification": None, "not_ready": None, "precision": precision_of(lm)}
    if spec.compile:
        compile_model(lm)
        info["compiled"] = lm.extra.get("compiled") is not None
        info["compile_error"] = lm.extra.get("compile_error")
        info["compile_ms"] = lm.extra.get("compile_ms")
    warm_up(lm)
    info["verification"] = None
    info["not_ready"] = None
    if verify_enabled(lm):
        info["verification"], info["not_ready"] = check_device(lm)
    probe, chosen = probe_precision(lm)
    info["precision"] = precision_of(lm, probe, chosen)
    return info


def precision_of(
    lm: LoadedModel, probe: dict[str, Any] | None = None, chosen: str | None = None
) -> dict[str, Any]:
    """``GET /v1/models/{id}``'s ``precision`` (CONTRACT 8.1): the requests' default (the
    models.toml setting, else the dtype the model is served in), the load-time probe's rows
    for ``auto`` (empty otherwise) and what it kept."""
    default = lm.spec.precision or str(precision_.model_dtype(lm.model)).removeprefix("torch.")
    return {"default": default, "probe": probe or {}, "chosen": chosen}


def probe_precision(lm: LoadedModel) -> tuple[dict[str, Any] | None, str | None]:
    """For ``precision = "auto"``: the engine's probe (every precision timed and compared
    with float32) on the probe method, at a size where the choice means something, so the
    first request does not pay for it: per precision tried its ``rel_l2`` and ``ok``, and
    what it kept, or why it could not run."""
    if lm.spec.precision != "auto":
        return None, None
    xs = probe_inputs(lm, PROBE_BATCH, AUTO_PROBE_LENGTH)
    method, params = probe_method(lm)
    return probed(
        lm,
        lambda: methods.attribute(
            lm.model,
            _one(xs),
            method,
            target=probe_target(lm),
            precision="auto",
            fidelity_tolerance=lm.spec.fidelity_tolerance,
            **params,
        ),
    )


def probed(lm: LoadedModel, run: Callable[[], Any]) -> tuple[dict[str, Any] | None, str | None]:
    """``run`` (an attribution with ``precision="auto"``, every kind its own) as the load-time
    probe: per precision tried its ``rel_l2`` and ``ok``, and what was kept, or why not."""
    try:
        res = run()
    except Exception as exc:  # requests measure for themselves
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        log.warning("attrserve: model %s: the precision probe could not run: %s", lm.spec.id, why)
        return None, f"the probe could not run ({why}); the first request of each method measures"
    chosen = str(res.fidelity.chosen)
    log.info("attrserve: model %s: precision auto %s", lm.spec.id, chosen)
    measured = precision_.probes_of(lm.model)
    return (measured[-1].table() if measured else None), chosen


# -- probes -------------------------------------------------------------------------------


def probe_inputs(lm: LoadedModel, n: int, length: int = PROBE_LENGTH) -> tuple[torch.Tensor, ...]:
    """A fixed, deterministic batch of ``n`` examples shaped as the model's input spec:
    floats uniform in [0, 1), integers (token ids) in [1, vocabulary)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in lm.spec.inputs:
        shape = [n, *(length if d is None else d for d in i.shape[1:])]
        dtype = i.torch_dtype
        if dtype.is_floating_point:
            x = torch.rand(shape, generator=gen, dtype=torch.float64).to(dtype)
        elif dtype == torch.bool:
            x = torch.zeros(shape, dtype=dtype)
        else:
            high = max(2, vocabulary(lm) or 2)
            x = torch.randint(1, high, shape, generator=gen).to(dtype)
        out.append(x.to(lm.device))
    return tuple(out)


def probe_target(lm: LoadedModel) -> Any:
    """Class 0 (index 0 of every output dim); None for one scalar per example."""
    shape = lm.spec.output.shape
    if not shape or shape == (1,):
        return None if not shape else 0
    return 0 if len(shape) == 1 else tuple(0 for _ in shape)


def _one(xs: tuple[torch.Tensor, ...]) -> Any:
    return xs if len(xs) > 1 else xs[0]


# -- compile ------------------------------------------------------------------------------


def compile_model(lm: LoadedModel) -> None:
    """``torch.compile`` the model and warm it up; on failure, eager with the reason kept.
    What it took is kept too (``compile_ms``): the cost compiled calls must win back."""
    spec = lm.spec
    start = time.perf_counter()
    try:
        compiled = torch.compile(lm.model, dynamic=True, mode=spec.compile_mode)
        floats = all(i.torch_dtype.is_floating_point for i in spec.inputs)
        target = probe_target(lm)
        for n in WARM_UP_BATCHES:
            xs = probe_inputs(lm, n)
            with torch.no_grad():  # perturbation methods and predictions
                compiled(*xs)
            if floats:  # gradient methods: forward and backward
                methods.attribute(compiled, _one(xs), "saliency", target=target)
    except Exception as exc:
        disable_compiled(lm, exc, "at load")
        return
    lm.extra["compiled"] = compiled
    lm.extra["compile_error"] = None
    lm.extra["compile_ms"] = (time.perf_counter() - start) * 1e3
    log.info(
        "attrserve: model %s compiled (mode %s) in %.0f ms",
        spec.id, spec.compile_mode, lm.extra["compile_ms"],
    )  # fmt: skip


# -- warm-up ------------------------------------------------------------------------------


def warm_up(lm: LoadedModel) -> None:
    """One tiny attribution per model, so the first request does not pay for lazy set-up."""
    xs = probe_inputs(lm, 1)
    with contextlib.suppress(Exception):  # best effort; real requests report real errors
        method, params = probe_method(lm)
        methods.attribute(lm.model, _one(xs), method, target=probe_target(lm), **params)


def probe_method(lm: LoadedModel) -> tuple[str, dict[str, Any]]:
    """Integrated gradients on the inputs, or (token models) on the embedding layer."""
    spec = lm.spec
    params: dict[str, Any] = {"n_steps": PROBE_STEPS}
    floats = all(i.torch_dtype.is_floating_point for i in spec.inputs)
    if not floats and spec.embedding_layer is not None:
        return "layer_integrated_gradients", {**params, "layer": spec.embedding_layer}
    return "integrated_gradients", params


# -- the device check ---------------------------------------------------------------------


def verify_enabled(lm: LoadedModel) -> bool:
    """models.toml ``verify_device``, by default on off the CPU and for 16-bit floats."""
    spec = lm.spec
    if spec.verify_device is not None:
        return spec.verify_device
    return lm.device.type != "cpu" or spec.dtype in LOW_PRECISION


def probes(lm: LoadedModel) -> list[tuple[str, dict[str, Any]]]:
    """The probe attributions: saliency and integrated gradients on float inputs, layer
    integrated gradients on the embedding of token models."""
    method, params = probe_method(lm)
    if method == "integrated_gradients":
        return [("saliency", {}), (method, params)]
    return [(method, params)]


def _ratio(v: Verification) -> float:
    return v.max_rel_diff / v.tolerance


def check_device(lm: LoadedModel) -> tuple[dict[str, Any], str | None]:
    """The probe's figures and, when they fail, why the model is not ready."""
    spec = lm.spec
    where = f"{lm.device.type}" + (f":{lm.device.index}" if lm.device.index is not None else "")
    served = f"{where}/{spec.dtype}" + (" compiled" if lm.extra.get("compiled") is not None else "")
    xs = _one(probe_inputs(lm, PROBE_BATCH))
    target = probe_target(lm)
    per_method: dict[str, dict[str, Any]] = {}
    worst: tuple[str, Verification] | None = None
    try:
        ref = reference(lm)
        for method, params in probes(lm):
            model = serving_model(lm, registry.get(method))
            _, v = verify(model, xs, method, reference=ref, target=target, **params)
            per_method[method] = v.as_dict()
            if worst is None or v.max_rel_diff / v.tolerance > _ratio(worst[1]):
                worst = (method, v)
    except Exception as exc:
        why = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        figures: dict[str, Any] = {"reference": "cpu-float64", "served": served, "error": why}
        if spec.verify_device:  # asked for explicitly: a check that cannot run is a failure
            return figures, f"the device check could not run: {why}"
        log.warning("attrserve: model %s: the device check could not run: %s", spec.id, why)
        return figures, None
    if worst is None:  # no probe ran (cannot happen: probes() is never empty)
        return {"reference": "cpu-float64", "served": served}, None
    method, v = worst
    figures = {**v.as_dict(), "served": served, "method": method, "methods": per_method}
    if v.ok:
        log.info(
            "attrserve: model %s: device check passed (%s vs cpu-float64: max rel diff %.3g, "
            "tolerance %.3g)",
            spec.id,
            served,
            v.max_rel_diff,
            v.tolerance,
        )
        return figures, None
    reason = (
        f"device check failed: {method} on {served} differs from the float64 CPU reference by "
        f"max_rel_diff {v.max_rel_diff:.3g} (max_abs_diff {v.max_abs_diff:.3g}), over the "
        f"{spec.dtype} tolerance {v.tolerance:.3g}"
    )
    log.error("attrserve: model %s: %s", spec.id, reason)
    return figures, reason
