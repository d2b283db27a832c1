"""Attacks and counterfactuals (CONTRACT 7.2): the request checked against the model and the
engine's rules (no model needed), costed, run as a job by the model's worker
(``service.robustness.work``), answered with the perturbed inputs, the model's output on them
and, where asked, pictures of the perturbation.

Cost, in forward rows per example (a backward counts as one): FGSM 3 (forward, backward, the
predictions' forward), PGD ``2 * step_num + 1``; a counterfactual search one forward per value
it tries (``(arg_max - arg_min) / arg_step`` linear, about its log2 binary), plus the gradient
of fgsm once, PGD's steps at every value, or feature ablation's attributions once.
"""

from __future__ import annotations

import asyncio
import base64
import math
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from methods import registry
from methods.errors import AttributionError, UnknownMethodError
from methods.robustness.attack import LOSSES
from methods.robustness.attack import check_params as check_attack
from methods.robustness.minimal import check_params as check_search
from model_registry.spec import ModelSpec
from service import kinds
from service.core.errors import InvalidRequest, LimitExceeded, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Reply, Work, new_id
from service.robustness.protocol import (
    AttackRequest,
    AttackResponse,
    CounterfactualRequest,
    CounterfactualResponse,
    PerturbationRender,
)
from service.robustness.work import Attack, Counterfactual, Perturbation
from service.serving import pictures, render
from service.serving.capability import Capability, Done
from service.wire import codec, targets
from service.wire.engine_errors import from_engine

Request = AttackRequest | CounterfactualRequest
R = TypeVar("R", AttackRequest, CounterfactualRequest)
#: params that are tensors (one per input, like baselines)
TENSORS = ("mask", "feature_mask", "baselines")
#: where the engine's arguments are in the body
WHERE: dict[str, tuple[str | int, ...]] = {
    "method": ("body", "method"),
    "perturbation": ("body", "perturbation"),
    **{name: ("body", "params", name) for name in ("baselines", "seed", "model")},
}
LOC = ("body", "render")


def _name(req: Request) -> str:
    return req.method if isinstance(req, AttackRequest) else req.perturbation


def _check_model(spec: ModelSpec) -> None:
    offers = kinds.of(spec).catalogue(spec)
    if not offers.predicts or offers.tokenizer:
        what = "takes token ids" if offers.tokenizer else "gives no predictions"
        raise UnsupportedMethod(
            f"model {spec.id!r} {what}: attacks and counterfactuals move a classifier's "
            "floating-point inputs",
            loc=("path", "model_id"),
        )
    ints = [i.name for i in spec.inputs if not i.dtype.startswith(("float", "bfloat"))]
    if ints:
        raise UnsupportedMethod(
            f"model {spec.id!r} takes {ints} as integers: attacks and counterfactuals move "
            "floating-point inputs",
            loc=("path", "model_id"),
        )


def _checked(req: Request, params: dict[str, Any]) -> dict[str, Any]:
    """The engine's checks of the params (tensors aside), every default filled in."""
    try:
        if isinstance(req, AttackRequest):
            return check_attack(req.method, params)
        return check_search(req.perturbation, params)
    except AttributionError as exc:
        raise from_engine(exc, "", WHERE) from None


def _rows(req: Request, p: dict[str, Any], n_features: int) -> int:
    """Forward rows per example (the module docstring's estimate)."""
    if isinstance(req, AttackRequest):
        return 3 if req.method == "fgsm" else 2 * int(p["step_num"]) + 1
    values = max(1, math.ceil((p["arg_max"] - p["arg_min"]) / p["arg_step"]))
    if p["mode"] == "binary":
        values = math.ceil(math.log2(values)) + 2 if values > 1 else 1
    per_value = {"pgd": 1 + 2 * int(p.get("step_num", 10))}.get(req.perturbation, 1)
    once = {"fgsm": 2}.get(req.perturbation, 0)
    if req.perturbation == "feature_ablation":
        ms = registry.get(p["attribution_method"])
        once = 2 if ms.family == "gradient" else n_features + 1
    return values * per_value + once


def build_work(settings: Settings, spec: ModelSpec, req: Request, deadline: float) -> Perturbation:
    """Every check that needs no model: the request as a job for the worker."""
    _check_model(spec)
    inputs = codec.decode_within(req.inputs, spec, settings)
    params = dict(req.params)
    loss = "nll"
    if isinstance(req, AttackRequest):
        loss = params.pop("loss", "nll")
        if loss not in LOSSES:
            raise InvalidRequest(
                f"params.loss must be one of {list(LOSSES)}, got {loss!r}",
                loc=("body", "params", "loss"),
            )
    if req.seed is not None and _name(req) in ("pgd", "gaussian_noise"):
        if params.get("seed", req.seed) != req.seed:
            raise InvalidRequest(
                "seed and params.seed differ; give one", loc=("body", "params", "seed")
            )
        params["seed"] = req.seed
    given = {k: params.pop(k) for k in TENSORS if k in params}
    p = _checked(req, {**params, **dict.fromkeys(given)})  # names now, tensors decoded below
    if p.get("attribution_method") is not None:
        try:
            registry.get(p["attribution_method"])
        except UnknownMethodError as exc:
            where = {"method": ("body", "params", "attribution_method")}
            raise from_engine(exc, "", where) from None
    for name, raw in given.items():
        loc = ("body", "params", name)
        p[name] = codec.decode_baselines(raw, spec, inputs, settings.max_tensor_elements, loc)
    if int(p.get("step_num") or 0) > settings.max_n_steps:
        raise LimitExceeded(
            f"params.step_num is {p['step_num']}; the server's limit is {settings.max_n_steps}",
            loc=("body", "params", "step_num"),
        )
    n_features = sum(int(np.prod(a.shape[1:])) for a in inputs.arrays)
    rows = _rows(req, p, n_features)
    if rows * inputs.n > settings.max_cost:
        fix = "send fewer examples" + (", fewer steps" if _name(req) == "pgd" else "")
        if isinstance(req, CounterfactualRequest):
            fix += ", a coarser arg_step or mode binary"
        raise LimitExceeded(
            f"this request would cost about {rows * inputs.n} forward rows ({inputs.n} "
            f"examples x {rows}); the limit is {settings.max_cost}: {fix}",
            loc=("body",),
        )
    if req.render is not None:
        _pictured(req.render, spec, inputs.arrays, inputs.n)
    kind = Attack if isinstance(req, AttackRequest) else Counterfactual
    work = kind(
        id=new_id(),
        model_id=spec.id,
        n=inputs.n,
        cost=max(1, rows * inputs.n),
        arrays=inputs.arrays,
        deadline=deadline,
        target=targets.resolve(req.target, spec.output, inputs.n),
        study={"name": _name(req), "params": p, "loss": loss},
    )
    if work.target is None:
        raise InvalidRequest(
            "a target class is needed (the class to move away from, or to reach with "
            'targeted): an index, a label, or "predicted"',
            loc=("body", "target"),
        )
    return work


def _pictured(spec: PerturbationRender, model: ModelSpec, arrays: Any, n: int) -> None:
    """The pictures asked for can be drawn (before any work)."""
    for k, i in enumerate(spec.examples or []):
        if not 0 <= i < n:
            raise InvalidRequest(
                f"render.examples[{k}] is {i}; the request has {n} examples (0..{n - 1})",
                loc=(*LOC, "examples", k),
            )
    if len(spec.examples or range(n)) * len(arrays) > pictures.MAX_RENDERS:
        raise InvalidRequest(
            f"render draws at most {pictures.MAX_RENDERS} pictures; choose examples with "
            "render.examples",
            loc=(*LOC, "examples"),
        )
    if spec.colormap is not None:
        try:
            render.colormap(spec.colormap)
        except render.RenderError as exc:
            raise InvalidRequest(str(exc), loc=(*LOC, "colormap")) from None
    for a in arrays:
        if a.ndim - 1 not in (1, 2, 3):
            raise InvalidRequest(
                f"render draws tabular rows and images; input {model.id!r} examples have "
                f"shape {list(a.shape[1:])}",
                loc=LOC,
            )


@dataclass(frozen=True)
class _Difference:
    """A difference's drawing: a diverging heat map (or bars) of perturbed - input."""

    colormap: str | None
    format: str = "png"
    kind: str = "heatmap"
    sign: str = "all"
    width: int | None = None


def draw(
    spec: PerturbationRender, model: ModelSpec, work: Perturbation, reply: Reply, title: str
) -> list[dict[str, Any]]:
    """Per chosen example and input: the perturbed image (image inputs), the difference."""
    out: list[dict[str, Any]] = []
    names = [i.name for i in model.inputs]
    style = _Difference(spec.colormap, spec.format, spec.kind, spec.sign, spec.width)
    for i in spec.examples if spec.examples is not None else range(work.n):
        for k, (x, moved) in enumerate(zip(work.arrays, reply.attributions, strict=True)):
            after = np.asarray(moved[i], dtype=np.float64)
            before = np.asarray(x[i], dtype=np.float64)
            diff = after - before
            drawn: list[tuple[str, render.Rendered]] = []
            picture = after.ndim == 2 or (after.ndim == 3 and after.shape[0] in (1, 3))
            try:
                if picture:
                    shown = render.image(after, f"{title} · perturbed", spec.width)
                    drawn.append(("perturbed", shown))
                change = "change" if diff.any() else "no change: the input is as it was"
                features = model.inputs[k].features if k < len(model.inputs) else None
                drawn.append((
                    "difference",
                    render.draw(
                        style, diff, inputs=before if picture else None,
                        title=f"{title} · {change}",
                        feature_names=list(features) if features and diff.ndim == 1 else None,
                    ),
                ))  # fmt: skip
            except render.RenderError as exc:
                raise InvalidRequest(f"render: {exc}", loc=LOC) from None
            for which, pic in drawn:
                entry: dict[str, Any] = {"example": i, "picture": which}
                if len(work.arrays) > 1:
                    entry["input"] = names[k] if k < len(names) else str(k)
                entry["media_type"] = pic.media_type
                entry["b64"] = base64.b64encode(pic.data).decode("ascii")
                out.append(entry)
    return out


def envelope(
    model: tuple[str, str],
    method: str,
    name: str,
    reply: Reply,
    encoding: str,
    timing_ms: dict[str, float],
) -> dict[str, Any]:
    """The attacks or counterfactuals response body (synchronous answers and a job's result);
    ``method``: ``Attack.label`` or ``Counterfactual.label``, ``name``: which attack or
    perturbation."""
    enc = [codec.encode_tensor(a, encoding) for a in reply.attributions]
    predictions = reply.predictions
    n = 0 if predictions is None else int(predictions.shape[0])
    if predictions is None:
        predictions = np.zeros((0, 0))
    return {
        "model_id": model[0],
        "model_version": model[1],
        "method" if method == Attack.label else "perturbation": name,
        "perturbed": enc if reply.as_tuple else enc[0],
        "predictions": codec.encode_tensor(predictions, encoding),
        "predicted": predictions.reshape(n, -1).argmax(axis=1).tolist() if n else [],
        "target": reply.target,
        **(reply.study or {}),
        "params": reply.params,
        "timing_ms": timing_ms,
    }


class _Perturbations(Capability[R]):
    """What attacks and counterfactuals share: the work (``build_work``), the answer
    (``envelope``), pictures of the perturbation."""

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: R,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        return build_work(settings, spec, req, deadline)

    def options(self, req: R, work: Work) -> dict[str, Any]:
        return {"encoding": req.output_encoding}

    def answer(self, done: Done) -> dict[str, Any]:
        work = done.work
        if not isinstance(work, Perturbation):
            raise TypeError(f"{self.operation} answers perturbations, not {type(work).__name__}")
        encoding = "json" if done.job else done.options.get("encoding", "json")
        name = str(work.study.get("name"))
        return envelope(done.model, work.label, name, done.reply, encoding, done.timing_ms)

    async def finish(self, req: R, done: Done, body: dict[str, Any]) -> dict[str, Any]:
        if req.render is not None:
            title = f"{done.spec.id} · {_name(req)}"
            work = done.work
            if not isinstance(work, Perturbation):
                raise TypeError(f"{self.operation} draws perturbations")
            body["renders"] = await asyncio.to_thread(
                draw, req.render, done.spec, work, done.reply, title
            )
        return body


class Attacks(_Perturbations[AttackRequest]):
    """``POST /v1/models/{model_id}/attacks``: FGSM or PGD on a batch."""

    operation = "attacks"
    stem = "attack"
    request = AttackRequest
    response = AttackResponse
    job_operation_id = "submitAttackJob"
    job_summary = (
        "Queue an attack on many examples as a job (checked now, run in chunks, persisted; "
        "``GET /v1/jobs/{job_id}/result`` answers as the attacks route does)."
    )

    def method(self, req: AttackRequest) -> str:
        return req.method


class Counterfactuals(_Perturbations[CounterfactualRequest]):
    """``POST /v1/models/{model_id}/counterfactuals``: the least perturbation that changes
    the model's answer, per example."""

    operation = "counterfactuals"
    stem = "counterfactual"
    request = CounterfactualRequest
    response = CounterfactualResponse
    job_operation_id = "submitCounterfactualJob"
    job_summary = "Queue a counterfactual search on many examples as a job (as attack-jobs)."

    def method(self, req: CounterfactualRequest) -> str:
        return req.perturbation


ATTACKS = Attacks()
COUNTERFACTUALS = Counterfactuals()
