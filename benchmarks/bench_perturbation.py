"""Perturbation methods, ours vs Captum at its default and at its best perturbations_per_eval.

Run: python -m benchmarks.bench_perturbation (issue: engine II). Warm medians, one process,
timed in alternating blocks (see ``timing.compare``). Ours runs at its defaults
(perturbations_per_eval="auto"). Targets (ours / Captum default): feature_ablation on the
MLP <= 0.05, shapley_value_sampling n_samples=25 <= 0.02, occlusion with 8x8 windows on the
3x64x64 CNN, N=8 <= 0.5.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from captum.attr import FeatureAblation, Occlusion, ShapleyValueSampling

import methods
from benchmarks.models import cnn, mlp
from benchmarks.timing import compare, max_abs_diff, setup_torch, table


def _sum_per_example(a: Any) -> torch.Tensor:
    return a.reshape(a.shape[0], -1).sum(1)


Case = tuple[str, Callable[[], Any], Callable[[int], Any], list[int], bool]


def cases() -> list[Case]:
    m, x = mlp(), torch.randn(4, 20)
    c, img = cnn(), torch.randn(8, 3, 64, 64)
    occ = {"sliding_window_shapes": (3, 8, 8), "strides": (3, 4, 4)}
    return [
        ("feature_ablation, MLP 20-64-64-3, N=4",
         lambda: methods.attribute(m, x, "feature_ablation", target=1).attributions,
         lambda ppe: FeatureAblation(m).attribute(x, target=1, perturbations_per_eval=ppe),
         [4, 20], False),
        ("shapley_value_sampling n_samples=25, MLP, N=4",
         lambda: methods.attribute(m, x, "shapley_value_sampling", target=1, n_samples=25,
                                   seed=0).attributions,
         lambda ppe: ShapleyValueSampling(m).attribute(x, target=1, n_samples=25,
                                                       perturbations_per_eval=ppe),
         [4, 20], True),
        ("occlusion 3x8x8 windows stride 4, CNN 3x64x64, N=8",
         lambda: methods.attribute(c, img, "occlusion", target=1, **occ).attributions,
         lambda ppe: Occlusion(c).attribute(img, target=1, perturbations_per_eval=ppe, **occ),
         [16, 64], False),
    ]  # fmt: skip


def main() -> None:
    setup_torch()
    # One intra-op thread for both sides: on a shared 2-core machine, thread contention
    # otherwise swamps small-model timings (and hits both libraries alike).
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows: list[list[object]] = []
    for label, ours, theirs, ppes, stochastic in cases():
        fns = [ours, *(lambda p=p, theirs=theirs: theirs(p) for p in [1, *ppes])]
        (t_ours, t_default, *t_ppes), ratio = compare(fns, budget_s=60)
        best = min(zip(t_ppes, ppes, strict=True))
        a, b = ours(), theirs(1)
        # Stochastic methods agree only in distribution; compare what efficiency fixes.
        diff = (
            float((_sum_per_example(a) - _sum_per_example(b)).abs().max())
            if stochastic
            else max_abs_diff(a, b)
        )
        rows.append([label, t_ours, t_default, f"{best[0]:.3f} (ppe={best[1]})",
                     ratio, diff])  # fmt: skip
    print(table(["case", "ours ms", "Captum default ms", "Captum best-ppe ms",
                 "ratio vs default", "max |diff|"], rows))  # fmt: skip
    print("\nmax |diff| for shapley_value_sampling compares per-example sums (efficiency).")
    print("Fast cases: medians of three measurement rounds; the ratio is the median round's.")


if __name__ == "__main__":
    main()
