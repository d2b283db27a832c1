"""Gradient methods, ours vs Captum, side by side in one process (issue: engine I).

Run: python -m benchmarks.bench_gradient. Warm medians, timed in alternating blocks (see
``timing.compare``). Targets: IG on the MLP <= 0.1 of Captum, saliency <= 0.7; IG on the CNN
<= 1.05 of the raw floor.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch
from captum.attr import DeepLift, IntegratedGradients, Saliency
from torch import nn

import methods
from benchmarks.models import cnn, mlp
from benchmarks.timing import compare, max_abs_diff, setup_torch, table


def floor_fn(model: nn.Module, x: torch.Tensor, target: int, n_steps: int) -> Callable[[], None]:
    """One batched forward+backward over exactly the N * n_steps rows IG evaluates (time it
    with the parameters frozen, as attributions run)."""
    rows = x.repeat(n_steps, *([1] * (x.dim() - 1)))

    def run() -> None:
        leaf = rows.detach().requires_grad_(True)
        torch.autograd.grad(model(leaf)[:, target].sum(), leaf)

    return run


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in model.parameters():
            p.requires_grad_(True)


def main() -> None:
    setup_torch()
    warnings.simplefilter("ignore")
    rows: list[list[object]] = []
    cases = [("MLP 20-64-64-3, N=4", mlp(), torch.randn(4, 20)),
             ("CNN 3x64x64, N=8", cnn(), torch.randn(8, 3, 64, 64))]  # fmt: skip
    t = 1  # the class attributed in every case
    for label, model, x in cases:
        runs = {
            "saliency": (
                lambda m=model, x=x: methods.attribute(m, x, "saliency", target=t).attributions,
                lambda m=model, x=x: Saliency(m).attribute(x, target=t),
            ),
            "integrated_gradients n=50": (
                lambda m=model, x=x: (
                    methods.attribute(
                        m, x, "integrated_gradients", target=t, n_steps=50
                    ).attributions
                ),
                lambda m=model, x=x: IntegratedGradients(m).attribute(x, target=t, n_steps=50),
            ),
            # the service's default: chunks sized by the engine (on a CPU, by the caches)
            "integrated_gradients n=50, internal_batch_size auto": (
                lambda m=model, x=x: (
                    methods.attribute(
                        m,
                        x,
                        "integrated_gradients",
                        target=t,
                        n_steps=50,
                        internal_batch_size="auto",
                    ).attributions
                ),
                lambda m=model, x=x: IntegratedGradients(m).attribute(x, target=t, n_steps=50),
            ),
            "deeplift": (
                lambda m=model, x=x: methods.attribute(m, x, "deeplift", target=t).attributions,
                lambda m=model, x=x: DeepLift(m).attribute(x, target=t),
            ),
        }
        for name, (ours, theirs) in runs.items():
            (ours_ms, theirs_ms), ratio = compare([ours, theirs], budget_s=20)
            rows.append([label, name, ours_ms, theirs_ms, ratio,
                         max_abs_diff(ours(), theirs())])  # fmt: skip
        ig_ours, ig_captum = runs["integrated_gradients n=50"]
        with frozen(model):
            (ig_ms, fl), ratio = compare([ig_ours, floor_fn(model, x, t, 50)], budget_s=20)
        rows.append([label, "IG n=50 vs raw fwd+bwd floor", ig_ms, fl, ratio, "-"])
        with torch.no_grad():
            gap = (model(x) - model(torch.zeros_like(x)))[:, t].abs()
        for tol in (1e-2, 1e-3):
            res = methods.attribute(model, x, "integrated_gradients", target=t, n_steps="auto",
                                    delta_tolerance=tol, return_convergence_delta=True)  # fmt: skip

            def run(m: nn.Module = model, x: torch.Tensor = x, tol: float = tol) -> object:
                return methods.attribute(m, x, "integrated_gradients", target=t,
                                         n_steps="auto", delta_tolerance=tol)  # fmt: skip

            (auto_ms, captum_ig), ratio = compare([run, ig_captum], budget_s=20)
            worst = float((res.convergence_delta.abs() / gap).max())
            rows.append([
                label, f"IG n_steps=auto tol {tol:.1%} -> {res.params['n_steps']} steps "
                f"(converged={res.params['converged']}, worst |delta|/gap {worst:.2g})",
                auto_ms, captum_ig, ratio, "vs Captum n=50",
            ])  # fmt: skip
    print(table(["case", "method", "ours ms", "Captum ms (or floor)", "ratio", "max |diff|"], rows))
    print("\nFast cases: medians of three measurement rounds; the ratio is the median round's.")


if __name__ == "__main__":
    main()
