"""Dependence as a capability: ``POST /v1/models/{model_id}/dependence`` (and its job route)
answers partial dependence and ICE curves of a tabular model (``methods.dependence``), equal
to scikit-learn's ``partial_dependence(method="brute")`` on the same grid; every grid value of
every row is one row of a batched forward in the worker."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service.core.errors import InvalidRequest, LimitExceeded, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Work, new_id
from service.dependence.protocol import DependenceRequest, DependenceResponse
from service.dependence.work import Dependence
from service.serving import curves
from service.serving.capability import Capability, Done
from service.wire import codec, targets


def _tabular(spec: ModelSpec) -> None:
    """Dependence sweeps a column: the model takes one floating row per example."""
    shapes = [i.shape for i in spec.inputs]
    row = len(spec.inputs) == 1 and len(shapes[0]) == 2 and shapes[0][1] is not None
    if not row or not spec.inputs[0].dtype.startswith(("float", "bfloat")) or spec.takes_text:
        described = ", ".join(f"{i.dtype} {list(i.shape)}" for i in spec.inputs)
        raise UnsupportedMethod(
            f"dependence sweeps a feature of tabular rows (one floating [N, F] input); model "
            f"{spec.id!r} takes {described}",
            loc=("path", "model_id"),
        )


def _target(spec: ModelSpec, raw: Any) -> int | None:
    """The output followed: a class (int or label), none for a model of one output."""
    if task_of(spec).targets not in ("classes", "none"):
        raise UnsupportedMethod(
            f"dependence follows a class score or a value; model {spec.id!r} is a "
            f"{task_of(spec).name} model",
            loc=("path", "model_id"),
        )
    if isinstance(raw, list) or raw == "predicted":
        raise InvalidRequest(
            "dependence follows one output for every row: a class (int or label)",
            loc=("body", "target"),
        )
    wire = targets.resolve(raw, spec.output, 1, task_of(spec).targets)
    return None if wire is None else int(wire["index"][0])


class DependenceCapability(Capability[DependenceRequest]):
    """``POST /v1/models/{model_id}/dependence``: a tabular model's curves."""

    operation = "dependence"
    stem = "dependence"
    request = DependenceRequest
    response = DependenceResponse
    job_operation_id = "submitDependenceJob"
    job_summary = "Queue a dependence request as a job (for many rows; run whole, persisted)."

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: DependenceRequest,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        _tabular(spec)
        target = _target(spec, req.target)
        low, high = req.percentiles
        if not 0 <= low < high <= 1:
            raise InvalidRequest(
                f"percentiles must be [low, high] with 0 <= low < high <= 1, got {[low, high]}",
                loc=("body", "percentiles"),
            )
        decoded = codec.decode_within(req.inputs, spec, settings)
        rows = decoded.arrays[0]
        width = int(rows.shape[1])
        for i, f in enumerate(req.features):
            if not 0 <= f < width:
                raise InvalidRequest(
                    f"feature {f} is out of range: the rows have {width} features (0..{width - 1})",
                    loc=("body", "features", i),
                )
        cost = decoded.n * req.grid_resolution * len(req.features)
        if cost > settings.max_cost:
            raise LimitExceeded(
                f"this request would cost about {cost} forward rows ({decoded.n} rows x "
                f"{req.grid_resolution} grid points x {len(req.features)} features); the limit "
                f"is {settings.max_cost}: send fewer rows or features, a coarser grid, or the "
                f"job route (POST /v1/models/{spec.id}/dependence-jobs)",
                loc=("body",),
            )
        return Dependence(
            id=new_id(), model_id=spec.id, n=decoded.n, cost=cost, arrays=decoded.arrays,
            deadline=deadline, request_id=request_id, features=list(req.features),
            target=target, grid_resolution=req.grid_resolution, percentiles=(low, high),
            kind=req.kind, output=req.output,
            batch_size=settings.max_internal_batch_size,
        )  # fmt: skip

    def answer(self, done: Done) -> dict[str, Any]:
        work = done.work
        names = done.spec.inputs[0].features or ()
        found = []
        for curve in (done.reply.study or {}).get("features", []):
            f = curve["feature"]
            found.append({**curve, "name": names[f] if f < len(names) else None})
        return {
            "model_id": done.spec.id,
            "model_version": done.spec.version,
            "target": getattr(work, "target", None),
            "output": getattr(work, "output", "raw"),
            "features": found,
            "timing_ms": done.timing_ms,
        }

    async def finish(
        self, req: DependenceRequest, done: Done, body: dict[str, Any]
    ) -> dict[str, Any]:
        if req.render:  # PNG encoding off the event loop
            body["renders"] = await asyncio.to_thread(_drawn, done.spec, body)
        return body

    def check_job(self, spec: ModelSpec, req: DependenceRequest) -> None:
        if req.render:
            raise InvalidRequest(
                "render draws pictures in synchronous answers; jobs return the curves",
                loc=("body", "render"),
            )


def _drawn(spec: ModelSpec, body: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for c in body["features"]:
        title = f"{spec.id} · {c['name'] or 'feature ' + str(c['feature'])}"
        png = curves.draw(c["grid"], c["average"], c["individual"], title)
        out.append({"feature": c["feature"], "media_type": "image/png",
                    "b64": base64.b64encode(png).decode("ascii")})  # fmt: skip
    return out


DEPENDENCE = DependenceCapability()
