"""What explanation metrics add to an attributions request: the attribution alone against the
attribution and a metric, at the metric's defaults, side by side in one process.

Run: python -m benchmarks.metrics. This is the worker's own call sequence (``methods.attribute``,
then ``methods.evaluate`` on its result: ``service.kinds.metrics``), so the ratios are what a
request's compute time grows by. Goal: infidelity and deletion/insertion at most 1.5x the
attribution's time at their defaults (each metric's perturbations are one batched forward, no
backward). sensitivity_max re-runs the method n_perturb_samples (10) times: about 11x by
construction, shown for completeness, and counted in the request's cost.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

import methods
from benchmarks.models import cnn, mlp
from benchmarks.timing import interleaved_ms, setup_torch, table

METRICS = ("infidelity", "deletion", "insertion")


def cases() -> list[tuple[str, Any, torch.Tensor, str, dict[str, Any]]]:
    torch.manual_seed(0)
    return [
        ("MLP 20-64-64-3, 64 rows", mlp(), torch.randn(64, 20), "integrated_gradients", {}),
        ("CNN 3x64x64, 8 images", cnn(), torch.rand(8, 3, 64, 64), "integrated_gradients", {}),
        ("MLP 20-64-64-3, 64 rows", mlp(), torch.randn(64, 20), "saliency", {}),
        ("CNN 3x64x64, 8 images", cnn(), torch.rand(8, 3, 64, 64), "saliency", {}),
    ]


def request(
    model: Any, x: torch.Tensor, method: str, params: dict[str, Any], metrics: dict[str, Any]
) -> Callable[[], Any]:
    """One request's compute: the attribution, then the metrics asked for (none: alone)."""

    def run() -> Any:
        attrs = methods.attribute(model, x, method, target=1, **params).attributions
        if metrics:
            return methods.evaluate(
                model, x, attrs, target=1, metrics=metrics, seed=0, method=method,
                method_params=params,
            )  # fmt: skip
        return attrs

    return run


def main() -> None:
    setup_torch()
    rows = []
    for name, model, x, method, params in cases():
        asked = [{m: {}} for m in METRICS] + [{m: {} for m in METRICS}, {"sensitivity_max": {}}]
        fns = [request(model, x, method, params, {})]
        fns += [request(model, x, method, params, m) for m in asked]
        rounds = [interleaved_ms(fns, repeat=20, budget_s=10) for _ in range(3)]
        times = [statistics.median(r[i] for r in rounds) for i in range(len(fns))]
        alone = times[0]
        rows.append([name, method, alone, *(t / alone for t in times[1:])])
    headers = ["case", "method", "attribution ms", *(f"+{m} x" for m in METRICS)]
    print(table([*headers, "+all three x", "+sensitivity_max x"], rows))


if __name__ == "__main__":
    main()
