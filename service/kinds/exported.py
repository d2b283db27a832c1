"""Requests to an ``attribution-export:`` model: a file that computes one attribution.

The file's step is fixed: its method, its params, its baselines, and its target (baked in, or
one class per example given at each call). A request may restate what is baked in, never
change it; each difference is a 422 naming the field. The program returns attributions only,
so there are no predictions (``:predict``, OIP infer, ``"predicted"`` targets) and no
``outputs``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch

from methods.cancel import checkpoint
from methods.engine.precision import Fidelity
from methods.errors import ModelError
from methods.params import MethodParams, parse_params
from methods.registry import MethodSpec
from model_registry.spec import ExplainSpec, ExportedStep, LoadedModel, ModelSpec
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Reply, WireTarget, runs
from service.kinds import checks, plan, prepare, tensors
from service.kinds.attribution import AttributionKind, AttributionRules
from service.kinds.base import Catalogue
from service.wire.attributions import AttributionRequest
from service.wire.targets import per_example, resolve, rows

#: request fields the program has no use for: (default, why)
FIXED_FIELDS: dict[str, str] = {
    "baselines": "the file's baselines are baked in",
    "noise_tunnel": "the file computes the method alone",
    "seed": "the file's program draws from torch's generator; it takes no seed",
    "return_convergence_delta": "the file's program returns the attributions only",
    "internal_batch_size": "the file's program evaluates a whole batch at once",
    "perturbations_per_eval": "the file's program evaluates a whole batch at once",
    "verify": "the file holds only the attribution step, no model to compare it with in float64",
    "precision": "the file's program runs in the dtype it was exported in",
}


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
    if req.output != "raw":
        raise InvalidRequest(
            "output: the file's program attributes the output it was exported with; omit it",
            loc=("body", "output"),
        )
    if isinstance(req.target, dict) and "top_k" in req.target:
        raise InvalidRequest(
            "target: the file's program attributes the classes it is given; send them",
            loc=("body", "target", "top_k"),
        )


def _baked_wire(target: Any) -> WireTarget:
    if target is None:
        return None
    if isinstance(target, (tuple, list)):
        return {"form": "index", "index": [int(t) for t in target]}
    return {"form": "index", "index": [int(target)]}


def _step(spec: ModelSpec) -> ExportedStep:
    if spec.exported is None:  # the kind is chosen from this field: never reached
        raise InvalidRequest("not an exported model", loc=("path", "model_id"))
    return spec.exported


def target(spec: ModelSpec, raw: Any, n: int) -> WireTarget:
    """The job's target: the request's classes (per-example programs), or the baked one
    (a request may restate it)."""
    step = _step(spec)
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
        wire = per_example(resolve(raw, spec.output, n), n)
        if wire is None or wire["form"] != "per_example":
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
    given = per_example(resolve(raw, spec.output, n), n)
    if given != per_example(baked, n):
        shown = "null" if step.target is None else repr(step.target)
        raise InvalidRequest(
            f"the file's target is baked in as {shown}; omit target or send that one", loc=loc
        )
    return baked


@dataclass(kw_only=True)
class ExportedAttribution(Attribution):
    """An attribution by the file's program: its forward is the attribution."""


class ExportedRules(AttributionRules):
    """The tensor kind's request rules against the step the file bakes in: the method is the
    file's, its params and target may be restated but never changed, the batch goes whole."""

    work = ExportedAttribution
    units = False  # the program takes the tokens it was exported for

    def plan(self, spec: ModelSpec, method: str, params: dict[str, Any]) -> plan.Plan:
        ms = checks.method_spec(method)
        checks.check_param_names(ms, params)
        check_method(spec, method)  # its layer (if any) is baked in
        return plan.Plan(ms, dict(params))

    def effective(
        self, spec: ModelSpec, ms: MethodSpec, req: AttributionRequest, p: MethodParams
    ) -> MethodParams:
        check_fields(req)
        return effective_params(ms, _step(spec), p)

    def engine_params(self, p: MethodParams) -> dict[str, Any]:
        return {}  # baked into the program

    def precision(self, spec: ModelSpec, req: AttributionRequest) -> str | None:
        return None  # the program's dtype (a request's precision is refused by check_fields)

    def target(self, spec: ModelSpec, ms: MethodSpec, raw: Any, n: int) -> WireTarget:
        return target(spec, raw, n)

    def batch_sizes(
        self, settings: Settings, spec: ModelSpec, req: AttributionRequest
    ) -> tuple[int | str | None, int | str | None]:
        return None, None  # the program evaluates a whole batch at once


class ExportedKind(AttributionKind):
    """A tensor model whose file computes one attribution (``attribution-export:``): the
    request is checked as a tensor model's (``kinds.attribution``) by the file's rules."""

    name = "exported"
    rules = ExportedRules()

    def describe(self, spec: ModelSpec) -> Catalogue:
        method = _step(spec).method
        return Catalogue(
            methods=[method],
            explanation=ExplainSpec(method),  # the file's own method, nothing else
            target=None,  # the file's baked target (a per-example one must be given)
            tokenizer=False,
            pictures=max(1, len(spec.inputs)),
            no_predictions=f"serves an exported {method} program, which returns "
            f"attributions, not predictions; use POST /v1/models/{spec.id}/attributions",
        )

    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> plan.Plan:
        return self.rules.plan(spec, method, params)  # the file fixed and checked its params

    def prepare(self, lm: LoadedModel) -> dict[str, Any]:
        """One call of the program, so the first request does not pay for lazy set-up."""
        xs = prepare.probe_inputs(lm, 1)
        extra: tuple[torch.Tensor, ...] = ()
        if _step(lm.spec).per_example_target:
            extra = (torch.zeros(1, dtype=torch.int64, device=lm.device),)
        with contextlib.suppress(Exception), torch.no_grad():  # real requests report errors
            lm.model(*xs, *extra)
        return super().prepare(lm)


@runs(ExportedAttribution)
def run(lm: LoadedModel, work: ExportedAttribution) -> Reply:
    """The program's forward is the attribution."""
    t0 = time.perf_counter()
    step = _step(lm.spec)
    xs, _ = tensors.inputs(lm, work)
    n = int(xs[0].shape[0])
    args = xs
    if step.per_example_target and work.target is not None:
        classes = torch.tensor(work.target["rows"], dtype=torch.int64, device=lm.device)
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
    parts = tensors.flat(attrs)
    return Reply(
        work_id=work.id,
        attributions=[tensors.numpy(a) for a in parts],
        as_tuple=isinstance(attrs, (tuple, list)),
        target=rows(work.target, n),
        params=dict(step.params or {}),
        compute_ms=(time.perf_counter() - t0) * 1e3,
        # the program's own dtype; it returns no delta and is never re-run in float32
        fidelity=Fidelity.of(parts[0].dtype if parts else torch.float32).as_dict(),
    )
