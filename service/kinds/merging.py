"""Which tensor jobs may share one engine call (the worker merges them: ``service.worker.merge``).

Only engine calls that are separable per example are merged: inputs are concatenated, targets
become one entry per example, and baselines/params must be identical (so they broadcast).
Seeded stochastic requests are never merged: their numbers would depend on their companions.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import orjson

from methods.params import MethodParams
from methods.registry import MethodSpec
from service.core.work import Attribution, Prediction
from service.wire import targets


def _digest(value: Any) -> Any:
    """A hashable fingerprint of params/baselines; None when a tensor is per example."""
    if isinstance(value, np.ndarray):
        h = hashlib.blake2b(value.tobytes(), digest_size=12).hexdigest()
        return ("array", str(value.dtype), value.shape, h)
    if isinstance(value, (list, tuple)):
        return tuple(_digest(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _digest(v)) for k, v in value.items()))
    return value


def _broadcasts(value: Any, shared: bool) -> bool:
    """Whether a tensor argument is the same for every example (so merged calls share it)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 or value.shape[0] == 1 or shared
    if isinstance(value, (list, tuple)):
        return all(_broadcasts(v, shared) for v in value)
    if isinstance(value, dict):
        return all(_broadcasts(v, shared) for v in value.values())
    return True


def _has_array(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return True
    return isinstance(value, (list, tuple)) and any(_has_array(v) for v in value)


def predict_key(work: Prediction) -> tuple[Any, ...] | None:
    """Predictions merge whenever their tensors stack (texts: each tokenized on its own)."""
    if work.texts:
        return None
    return (work.model_id, Prediction.label, tuple((a.dtype.str, a.shape[1:]) for a in work.arrays))


def key(
    work: Attribution, ms: MethodSpec, p: MethodParams, texts_batch: bool = False
) -> tuple[Any, ...] | None:
    """Jobs with equal keys give the same numbers merged as one by one; None: never merge.
    Texts merge only where the model batches them unchanged (``ModelSpec.texts_batch``)."""
    if work.verify or ms.coupled(p):  # verify: figures of the job's own rows
        return None
    # texts: where the model batches them unchanged, and the answer is per token (dim 1 the
    # tokens, cut back to each job's own width)
    per_token = work.attributed_layer is not None or ms.family == "perturbation"
    if work.texts and not (texts_batch and per_token):
        return None
    if (ms.stochastic or work.noise_tunnel is not None) and work.seed is not None:
        return None
    # params only broadcast: a per-example tensor (e.g. a feature mask per row) never merges
    if not _broadcasts(work.params, False):
        return None
    if not _broadcasts(work.baselines, ms.baseline_distribution):
        return None
    params = orjson.dumps(
        {k: v for k, v in work.params.items() if not _has_array(v)},
        option=orjson.OPT_SORT_KEYS,
    )
    return (
        work.model_id,
        work.method,
        params,
        _digest(work.params),
        _digest(work.baselines),
        targets.form(work.target),
        tuple((a.dtype.str, a.shape[1:]) for a in work.arrays),
        work.internal_batch_size,
        work.perturbations_per_eval,
        _digest(work.noise_tunnel),
        work.return_delta,
        work.attributed_layer,
        work.post_abs,
        bool(work.texts),
        work.precision,
        work.output,
        work.units,
    )
