"""One chunk of examples: the HTTP route's checks (``build_work``) and engine call (``run_work``),
and the columns to write."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from model_registry.spec import LoadedModel, ModelSpec
from service.cli.offline.engine import (
    AttributionRequest,
    build_work,
    from_engine,
    kind_of,
    run_work,
    validated,
)
from service.cli.offline.inputs import Examples
from service.core.errors import AttributionFailed, InvalidRequest
from service.core.settings import Settings


def chunk_target(examples: Examples, default: Any, predicted: list[int] | None = None) -> Any:
    """The request target for these examples: ``default``, or one per example where the file
    gives some (items without one take ``default``). ``"predicted"`` beside given targets takes
    each example's predicted class from ``predicted`` (the model's, ``attribute_batch``); without
    it (checks before the model runs) class 0 stands in."""
    if examples.targets is None or all(t is None for t in examples.targets):
        return default
    fill: list[Any] = [default] * examples.n
    if default == "predicted":
        fill = predicted if predicted is not None else [0] * examples.n
    items = [f if t is None else t for t, f in zip(examples.targets, fill, strict=True)]
    if all(t == items[0] for t in items):
        return items[0]
    return items


def _inputs(examples: Examples) -> Any:
    """The examples as the request's ``inputs``."""
    if examples.raw is not None:
        return list(examples.raw)
    if examples.arrays is None:  # read_examples gives arrays or raw examples; say so if neither
        raise InvalidRequest("the input file holds no examples", loc=("body", "inputs"))
    arrays = examples.arrays
    # one input: the bare array, so shape errors read as for a nested list on the wire
    return next(iter(arrays.values())) if len(arrays) == 1 else dict(arrays)


def _request(
    request: dict[str, Any], examples: Examples, predicted: list[int] | None = None
) -> Any:
    body = {
        **request,
        "inputs": _inputs(examples),
        "target": chunk_target(examples, request.get("target"), predicted),
    }
    return validated(AttributionRequest, body, ("body",))


def check_batch(
    settings: Settings,
    spec: ModelSpec,
    request: dict[str, Any],
    examples: Examples,
    predicted: list[int] | None = None,
) -> Any:
    """The chunk as the HTTP route's ``Attribution`` work: every check ``attribute_batch``
    makes, without the model (a ServiceError for what the route would refuse)."""
    return build_work(settings, spec, _request(request, examples, predicted), math.inf)


def _predicted(
    lm: LoadedModel, spec: ModelSpec, request: dict[str, Any], examples: Examples, s: Settings
) -> list[int] | None:
    """Each example's predicted class, where ``"predicted"`` fills in beside given targets."""
    own = examples.targets
    if request.get("target") != "predicted" or own is None:
        return None
    if all(t is None for t in own) or all(t is not None for t in own):
        return None
    work = kind_of(spec).predict_work(s, spec, _inputs(examples), math.inf, "")
    reply = _run(lm, work)
    if reply.predictions is None:  # pragma: no cover - a predict job always has them
        return None
    return [int(c) for c in reply.predictions.reshape(examples.n, -1).argmax(-1)]


def _run(lm: LoadedModel, work: Any) -> Any:
    """``run_work``, its failures as the worker reports them."""
    from methods.errors import AttributionError, ModelError

    try:
        return run_work(lm, work)
    except ModelError as exc:
        # a person runs this: the model's own message helps more than a log reference
        raise AttributionFailed(str(exc), loc=("body", "inputs")) from None
    except AttributionError as exc:
        raise from_engine(exc) from None


def attribute_batch(
    lm: LoadedModel,
    spec: ModelSpec,
    request: dict[str, Any],
    examples: Examples,
    settings: Settings,
) -> dict[str, np.ndarray | list[Any]]:
    """One chunk through the HTTP route's checks and engine call: the columns to write.

    ``request`` holds the attributions request's fields but ``inputs`` (``method``,
    ``target``, ``params``, ``baselines``, ...); its ``target`` is the default for examples
    without their own in ``examples.targets``. Raises the ServiceError the route would answer.

    Columns: ``attributions`` (``attributions_<input>`` per input where the attributions
    mirror several inputs), ``outputs``, ``convergence_delta`` and ``target`` where present,
    for raw texts ``tokens`` and for a folder of images ``file_name``; texts' columns are lists
    (one item per example), per-token scores cut to each text's tokens.
    """
    import methods.registry

    predicted = _predicted(lm, spec, request, examples, settings)
    work = check_batch(settings, spec, request, examples, predicted)
    reply = _run(lm, work)
    parts: list[np.ndarray] = reply.attributions
    if reply.as_tuple:
        names = [i.name for i in spec.inputs]
        keys = [f"attributions_{names[i] if i < len(names) else i}" for i in range(len(parts))]
    else:
        keys = ["attributions"]
    cols: dict[str, np.ndarray | list[Any]] = {}
    if reply.tokens is not None:
        tokens = reply.tokens
        per_token = work.attributed_layer is not None or (
            methods.registry.get(work.method).family == "perturbation"
        )
        for key, part in zip(keys, parts, strict=True):
            rows = [part[i, : len(t)] if per_token else part[i] for i, t in enumerate(tokens)]
            cols[key] = [np.ascontiguousarray(r) for r in rows]
    else:
        cols.update(zip(keys, parts, strict=True))
    if reply.outputs is not None:
        cols["outputs"] = reply.outputs
    if reply.delta is not None:
        cols["convergence_delta"] = reply.delta
    if reply.target is not None:
        cols["target"] = np.asarray(reply.target)
    if reply.tokens is not None:
        cols["tokens"] = [list(t) for t in reply.tokens]
    if examples.files is not None:
        cols["file_name"] = np.asarray(examples.files)
    return cols
