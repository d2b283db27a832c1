"""KServe V1 (``:predict``, ``:explain``): its bodies translated to and from the attributions
route's, which does all the work (codec checks, limits, batching, cancellation, errors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import BaseModel, ValidationError

from model_registry.spec import ModelSpec
from service import kinds
from service.compat.protocol import V1Request
from service.core.errors import WHERE, InvalidRequest, Loc, ServiceError
from service.core.settings import Settings
from service.core.work import Reply
from service.kinds.base import grouped
from service.wire import codec, images
from service.wire.attributions import REQUEST_FIELDS, AttributionRequest

#: attributions request fields that ``parameters`` may not set (they come from the body)
NOT_PARAMETERS = ("inputs",)


def validated(model: type[BaseModel], data: Any, prefix: Loc) -> Any:
    """``model.model_validate(data)``; a 422 naming the fields (under ``prefix``) otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [
            {"loc": [*prefix, *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        first = errors[0]
        raise InvalidRequest(
            f"{WHERE}: {first['msg']}", errors=errors, about=tuple(first["loc"])
        ) from None


Move = Callable[[Loc], Loc]


def v1_move(instances: bool) -> Move:
    """KServe V1: ``inputs`` came from ``instances``; request fields from ``parameters``."""
    fields = REQUEST_FIELDS - {"inputs"} | {"method", "params"}

    def move(loc: Loc) -> Loc:
        if len(loc) > 1 and loc[1] == "inputs" and instances:
            return ("body", "instances", *loc[2:])
        if len(loc) > 1 and loc[1] in fields:
            return ("body", "parameters", *loc[1:])
        return loc

    return move


def with_defaults(given: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """Explain parameters with the model's defaults (its kind's): its default method (and that
    method's params) when none is named, and the default target when none is given (each
    example's predicted class, what an explanation of a prediction explains)."""
    kind = kinds.of(spec)
    out = dict(given)
    if "method" not in out:
        ex = kind.catalogue(spec).explanation
        out["method"] = ex.method
        out.setdefault("params", dict(ex.params))
    if "target" not in out:
        out["target"] = kind.catalogue(spec).target
    return out


def check_explanation(spec: ModelSpec, settings: Settings) -> None:
    """Start-up check of a models.toml ``explain``: the method serves this model and its
    params validate (the message names the model; the server does not start otherwise)."""
    ex = kinds.of(spec).catalogue(spec).explanation
    try:
        kinds.of(spec).check(spec, ex.method, dict(ex.params), settings)
    except ServiceError as exc:
        raise ValueError(
            f"model {spec.id!r}: explain = {ex.method!r} cannot run: {exc.detail}"
        ) from None


def inputs_of(body: V1Request, spec: ModelSpec) -> Any:
    """``instances`` (one entry per example) as the attributions route's ``inputs``."""
    if body.instances is None:
        if body.inputs is None:
            raise InvalidRequest(
                "send instances (one entry per example) or inputs", loc=("body", "instances")
            )
        return body.inputs
    if body.inputs is not None:
        raise InvalidRequest("send instances or inputs, not both", loc=("body", "inputs"))
    inst = body.instances
    if not inst:
        raise InvalidRequest("instances hold no examples", loc=("body", "instances"))
    if all(codec.is_text(i) for i in inst) or all(images.is_image(i) for i in inst):
        return inst  # texts (or pairs of them), encoded images
    if kinds.of(spec).catalogue(spec).example_fields is not None:
        return inst  # examples as objects: the model's kind reads them
    names = [i.name for i in spec.inputs]
    if all(isinstance(i, dict) and not codec.is_tensor_object(i) for i in inst):
        by_name: dict[str, list[Any]] = {n: [] for n in names}
        for k, example in enumerate(inst):
            if set(example) != set(names):
                raise InvalidRequest(
                    f"instances[{k}] must give exactly the model's inputs {names}, got "
                    f"{sorted(example)[:8]}",
                    loc=("body", "instances", k),
                )
            for n in names:
                by_name[n].append(example[n])
        return by_name
    if len(names) > 1:
        raise InvalidRequest(
            f"model {spec.id!r} takes {len(names)} inputs {names}: each instance must be an "
            "object keyed by input name",
            loc=("body", "instances"),
        )
    return inst


def explain_request(body: V1Request, spec: ModelSpec, inputs: Any) -> AttributionRequest:
    """The attributions request for ``:explain``: ``parameters``, or the model's default."""
    given = dict(body.parameters or {})
    for name in NOT_PARAMETERS:
        if name in given:
            raise InvalidRequest(
                f"parameters.{name}: the inputs come from the body's instances",
                loc=("body", "parameters", name),
            )
    req: AttributionRequest = validated(
        AttributionRequest, {**with_defaults(given, spec), "inputs": inputs}, ("body", "parameters")
    )
    return req


def _rows(value: np.ndarray | None, n: int, i: int, enc: str) -> Any:
    """Example ``i``'s part of a per-example array (k rows per example where there are k·n)."""
    if value is None:
        return None
    if value.ndim == 0 or value.shape[0] % n:
        return codec.encode_tensor(value, enc)
    k = value.shape[0] // n
    part = value[i * k : (i + 1) * k]
    one = part[0] if k == 1 else part
    return one.item() if enc == "json" and np.ndim(one) == 0 else codec.encode_tensor(one, enc)


def explanations(reply: Reply, enc: str) -> list[dict[str, Any]]:
    """The attributions response, one entry per example (each example's rows of the reply,
    in the answer's structure: ``kinds.base.grouped``)."""
    n = (
        int(reply.predictions.shape[0])
        if reply.predictions is not None
        else len(reply.target or [])
    )
    out = []
    for i in range(n):
        entry: dict[str, Any] = {
            "attributions": grouped([_rows(a, n, i, enc) for a in reply.attributions], reply),
            "target": None if reply.target is None else reply.target[i],
            "output": None if reply.outputs is None else float(reply.outputs.reshape(n, -1)[i, 0]),
        }
        if reply.delta is not None:
            entry["convergence_delta"] = _rows(reply.delta, n, i, enc)
        if reply.base_values is not None:  # Shapley-family: base value + attributions = output
            entry["base_value"] = _rows(reply.base_values, n, i, enc)
        if reply.standard_error is not None:
            entry["standard_error"] = grouped(
                [_rows(e, n, i, enc) for e in reply.standard_error], reply
            )
        if reply.tokens is not None:
            entry["tokens"] = reply.tokens[i]
        if reply.units is not None:
            entry["units"] = reply.units[i]
        if reply.segments is not None:  # the segments credited: [H, W] per image input
            maps = [_rows(m, n, i, enc) for m in reply.segments]
            entry["feature_mask"] = maps[0] if len(maps) == 1 else maps
        for name in reply.study_rows or []:  # a task's per-example answer (its answers)
            if reply.study is not None and "." not in name:
                entry[name.removesuffix("s")] = reply.study[name][i]
        if reply.metrics is not None:  # this example's scores
            entry["metrics"] = {
                name: {k: v[i] for k, v in value.items()} if isinstance(value, dict) else value[i]
                for name, value in reply.metrics.items()
            }
        out.append(entry)
    return out


def explain_response(result: dict[str, Any], reply: Reply, enc: str) -> dict[str, Any]:
    """KServe's explain body: the attributions answer (``result``, built once by the model's
    kind) reshaped per instance, with the predictions."""
    body = {
        "model_id": result["model_id"],
        "model_version": result["model_version"],
        "method": result["method"],
        "params": result["params"],
        "predictions": reply.predictions,
        "explanations": explanations(reply, enc),
        "timing_ms": result["timing_ms"],
    }
    for extra in ("requested_method", "attributed_layer", "renders"):
        if result.get(extra) is not None:
            body[extra] = result[extra]
    return body
