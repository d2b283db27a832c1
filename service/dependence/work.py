"""The worker's side of dependence: ``methods.partial_dependence`` on the loaded model."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import methods.dependence as dependence
from model_registry.spec import LoadedModel
from model_registry.tasks import task_of
from service.core.work import Reply, Work, runs
from service.kinds import tensors


@dataclass(kw_only=True)
class Dependence(Work):
    """One model's curves over the rows given (the grid is the rows': never cut)."""

    label: ClassVar[str] = "dependence"
    divisible: ClassVar[bool] = False

    features: list[int] = field(default_factory=list)
    target: int | None = None
    grid_resolution: int = 15
    percentiles: tuple[float, float] = (0.05, 0.95)
    kind: str = "average"
    output: str = "raw"
    batch_size: int | None = None


@runs(Dependence)
def run(lm: LoadedModel, work: Dependence) -> Reply:
    t0 = time.perf_counter()
    xs, _ = tensors.inputs(lm, work)
    curves = dependence.partial_dependence(
        lm.model, xs[0], work.features, target=work.target,
        grid_resolution=work.grid_resolution, percentiles=work.percentiles,
        kind=work.kind, output=work.output,  # type: ignore[arg-type]
        multi_label=task_of(lm.spec).independent, batch_size=work.batch_size,
    )  # fmt: skip
    study: dict[str, Any] = {"features": [c.as_dict() for c in curves]}
    return Reply(work_id=work.id, study=study, compute_ms=(time.perf_counter() - t0) * 1e3)
