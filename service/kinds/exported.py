"""Requests to an ``attribution-export:`` model: a file that computes one attribution.

The file's step is fixed: its method, its params, its baselines, and its target (baked in, or
one class per example given at each call). A request may restate what is baked in, never
change it; each difference is a 422 naming the field. The program returns attributions only,
so there are no predictions (``:predict``, OIP infer, ``"predicted"`` targets) and no
``outputs``.
"""

from __future__ import annotations

from typing import Any

from methods.params import MethodParams, parse_params
from methods.registry import MethodSpec
from model_registry.spec import ExportedStep, ModelSpec
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.wire.attributions import AttributionRequest
from service.wire.targets import WireTarget, per_example, resolve_target

#: request fields the program has no use for: (default, why)
FIXED_FIELDS: dict[str, str] = {
    "baselines": "the file's baselines are baked in",
    "noise_tunnel": "the file computes the method alone",
    "seed": "the file's program draws from torch's generator; it takes no seed",
    "return_convergence_delta": "the file's program returns the attributions only",
    "internal_batch_size": "the file's program evaluates a whole batch at once",
    "perturbations_per_eval": "the file's program evaluates a whole batch at once",
    "verify": "the file holds only the attribution step, no model to compare it with in float64",
}


def not_for_predictions(spec: ModelSpec) -> None:
    """``:predict``, OIP infer and KServe explain (which returns predictions) are refused."""
    if spec.exported is not None:
        raise UnsupportedMethod(
            f"model {spec.id!r} serves an exported {spec.exported.method} program, which "
            "returns attributions, not predictions; use POST "
            f"/v1/models/{spec.id}/attributions",
            loc=("path", "model_id"),
        )


def check_method(spec: ModelSpec, name: str) -> None:
    step = spec.exported
    if step is not None and name != step.method:
        raise UnsupportedMethod(
            f"model {spec.id!r} is an exported {step.method} program: it computes "
            f"{step.method} only, not {name}",
            loc=("body", "method"),
        )


def _plain(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def effective_params(ms: MethodSpec, step: ExportedStep, given: MethodParams) -> MethodParams:
    """The baked params (validated, for the cost and the limits), after checking that every
    param the request gives equals the baked one."""
    baked = step.params
    for name in sorted(given.model_fields_set):
        loc = ("body", "params", name)
        if baked is None:
            raise InvalidRequest(
                f"the file does not say which params it bakes in; send no params ({name} given)",
                loc=loc,
            )
        value = _plain(given.model_dump()[name])
        if name not in baked or baked[name] != value:
            shown = f"{baked[name]!r}" if name in baked else "not a param of the file"
            raise InvalidRequest(
                f"{name} is baked into the file as {shown}; omit it or send that value "
                f"(got {value!r})",
                loc=loc,
            )
    if baked is None:
        return given
    plain = {k: v for k, v in baked.items() if not (isinstance(v, dict) and "tensor" in v)}
    fields = ms.params.model_fields
    return parse_params(ms.params, ms.name, {k: v for k, v in plain.items() if k in fields})


def check_fields(req: AttributionRequest) -> None:
    """Request fields the program cannot honour, when given other than their defaults."""
    for name, why in FIXED_FIELDS.items():
        value = getattr(req, name)
        if value is not None and value is not False:
            raise InvalidRequest(f"{name}: {why}; omit it", loc=("body", name))


def _baked_wire(target: Any) -> WireTarget:
    if target is None:
        return None
    if isinstance(target, (tuple, list)):
        return {"kind": "index", "index": [int(t) for t in target]}
    return {"kind": "index", "index": [int(target)]}


def target(spec: ModelSpec, raw: Any, n: int) -> WireTarget:
    """The job's target: the request's classes (per-example programs), or the baked one
    (a request may restate it)."""
    step = spec.exported
    if step is None:  # callers check; this narrows the type
        raise InvalidRequest("not an exported model", loc=("body", "target"))
    loc = ("body", "target")
    if raw == "predicted":
        raise InvalidRequest(
            '"predicted" needs the model\'s predictions; this file returns attributions only: '
            "send the classes",
            loc=loc,
        )
    if step.per_example_target:
        if raw is None:
            raise InvalidRequest(
                "target is required: the file takes one class per example (an int, a label, "
                "or one per example)",
                loc=loc,
            )
        wire = per_example(resolve_target(raw, spec.output, n), n)
        if wire is None or wire["kind"] != "per_example":
            raise InvalidRequest(
                "the file takes one class per example (an int, a label, or one per example), "
                "not an index into a larger output",
                loc=loc,
            )
        return wire
    if not step.described:
        if raw is not None:
            raise InvalidRequest(
                "the file does not say which target it bakes in; send no target", loc=loc
            )
        return None
    baked = _baked_wire(step.target)
    if raw is None:
        return baked
    given = per_example(resolve_target(raw, spec.output, n), n)
    if given != per_example(baked, n):
        shown = "null" if step.target is None else repr(step.target)
        raise InvalidRequest(
            f"the file's target is baked in as {shown}; omit target or send that one", loc=loc
        )
    return baked
