"""The worker's side of attacks and counterfactuals (``service.robustness.serving``):
``methods.attack`` or ``methods.min_perturbation`` on the model, at the job's target (each
example's predicted class resolved first by one forward)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

import methods
from model_registry.spec import LoadedModel
from service.core.work import Index, Reply, WireTarget, Work, cut_target, rows, runs
from service.kinds import tensors
from service.wire import targets


@dataclass(kw_only=True)
class Perturbation(Work):
    """An attack or a counterfactual search at the target (each example's predicted class
    resolved in the worker by one forward)."""

    target: WireTarget = None
    #: which (``name``), its params (tensors per input), and an attack's ``loss``
    study: dict[str, Any] = field(default_factory=dict)

    def _cut_fields(self, ndim: tuple[int, ...], index: Index) -> dict[str, Any]:
        params = rows(self.study["params"], self.n, ndim, index)  # masks, baselines
        target = cut_target(self.target, index)
        return {"target": target, "study": {**self.study, "params": params}}


@dataclass(kw_only=True)
class Attack(Perturbation):
    label: ClassVar[str] = "attack"


@dataclass(kw_only=True)
class Counterfactual(Perturbation):
    label: ClassVar[str] = "counterfactual"


def run(lm: LoadedModel, work: Perturbation) -> Reply:
    t0 = time.perf_counter()
    study = work.study or {}
    xs, _ = tensors.inputs(lm, work)
    n = int(xs[0].shape[0])
    wire = work.target
    if targets.predicted(wire):
        wire = targets.of_predictions(tensors.forward(lm, xs))
    target = targets.to_engine(wire)
    params = {k: tensors.convert(v, lm.device) for k, v in study["params"].items()}
    inputs = xs if len(xs) > 1 else xs[0]
    if isinstance(work, Attack):
        res = methods.attack(
            lm.model, inputs, study["name"], target=target, loss=study["loss"], **params
        )
        found: dict[str, list[bool] | list[float | None]] = {
            "flipped": res.flipped.tolist(),
            "zero_gradient": res.zero_gradient.tolist(),
        }
    else:
        cf = methods.min_perturbation(lm.model, inputs, study["name"], target=target, **params)
        res, found = cf, {"min_param": cf.min_param}  # type: ignore[assignment]
    perturbed = tensors.flat(res.perturbed)
    shown = shown_params(study["params"])
    if isinstance(work, Attack):
        shown["loss"] = study["loss"]
    return Reply(
        work_id=work.id,
        attributions=[tensors.numpy(p) for p in perturbed],
        as_tuple=isinstance(res.perturbed, tuple),
        predictions=tensors.numpy(res.predictions),
        target=targets.rows(wire, n),
        params=shown,
        study=dict(found),
        study_rows=list(found),  # flipped, zero_gradient, min_param: one per example
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


runs(Attack)(run)
runs(Counterfactual)(run)


def shown_params(p: dict[str, Any]) -> dict[str, Any]:
    """The effective params for the response: a tensor by its shape, not its values."""
    shown: dict[str, Any] = {}
    for k, v in p.items():
        if isinstance(v, tuple):
            v = [{"shape": list(a.shape)} if isinstance(a, np.ndarray) else a for a in v]
            v = v[0] if len(v) == 1 else v
        shown[k] = v
    return shown
