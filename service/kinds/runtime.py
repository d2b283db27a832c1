"""The model a method runs on in the worker: the compiled module where the method allows it,
the eager one otherwise (and from the first failure of the compiled one on), and the model's
float64 CPU copy for ``verify``."""

from __future__ import annotations

import logging
from typing import Any

import torch

import methods
from methods.registry import MethodSpec
from methods.verify import reference_model
from model_registry.spec import LoadedModel

log = logging.getLogger("attrserve.worker")


def uses_compiled(ms: MethodSpec) -> bool:
    """Whether a method may run on the compiled module: it must not hook or intercept the
    model's modules (compiled graphs do not call them)."""
    return not ms.needs_hooks and ms.family not in ("layer", "neuron")


def serving_model(lm: LoadedModel, ms: MethodSpec) -> Any:
    """The module a method runs on: the compiled one where it can, else the eager one."""
    compiled = lm.extra.get("compiled")
    return compiled if compiled is not None and uses_compiled(ms) else lm.model


def worth_eager_retry(exc: BaseException) -> bool:
    """Whether a failure on the compiled model may be the compiler's: anything but a typed
    input error, a cancellation or an out-of-memory error (the eager model gives those too).
    The caller retries on the eager model and drops the compiled one only if that succeeds,
    so the model's own failures are reported as its own (no private torch exception types)."""
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    return isinstance(exc, methods.ModelError) or not isinstance(exc, methods.AttributionError)


def disable_compiled(lm: LoadedModel, exc: BaseException, when: str) -> None:
    """Serve ``lm`` eagerly from now on; the reason logged and reported."""
    cause = exc.__cause__ if isinstance(exc, methods.ModelError) and exc.__cause__ else exc
    first = " ".join(str(cause).split())[:300]
    reason = f"{type(cause).__name__}: {first}" if first else type(cause).__name__
    lm.extra["compiled"] = None
    lm.extra["compile_error"] = reason
    log.warning(
        "attrserve: model %s: torch.compile failed %s; serving eagerly: %s",
        lm.spec.id,
        when,
        reason,
    )


def reference(lm: LoadedModel) -> Any:
    """The model's float64 CPU copy, made once (at the first check that needs it)."""
    ref = lm.extra.get("reference")
    if ref is None:
        ref = reference_model(lm.model)
        lm.extra["reference"] = ref
    return ref
