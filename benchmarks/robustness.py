"""FGSM and PGD, ours vs Captum's, side by side in one process.

Run: python -m benchmarks.robustness. Warm medians, timed in alternating blocks (see
``timing.compare``); the goal is at most 0.5 of Captum's time. Both use the same loss
(cross-entropy per example, summed) and give the same numbers (checked here). The floor is
what any attack must compute: one forward+backward to the inputs per step, nothing else
(Captum's FGSM and PGD are that); ours adds one forward for the predictions it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from captum.robust import FGSM, PGD
from torch import nn

import methods
from benchmarks.models import cnn, mlp
from benchmarks.timing import compare, max_abs_diff, setup_torch, table


def floor(model: nn.Module, x: torch.Tensor, y: torch.Tensor, passes: int) -> Callable[[], Any]:
    """The least any attack can do: ``passes`` forward+backward passes to the inputs' loss."""
    loss = nn.CrossEntropyLoss(reduction="sum")

    def run() -> Any:
        z = x
        for _ in range(passes):
            z = z.detach().requires_grad_()
            (g,) = torch.autograd.grad(loss(model(z), y), z)
            z = z + 0.01 * g.sign()
        return z

    return run


def cases() -> list[tuple[str, Callable[[], Any], Callable[[], Any], Callable[[], Any]]]:
    loss = nn.CrossEntropyLoss(reduction="none")
    out = []
    for name, model, x in (
        ("MLP 20-64-64-3, 64 rows", mlp(), torch.randn(64, 20)),
        ("CNN 3x64x64, 16 images", cnn(), torch.rand(16, 3, 64, 64)),
    ):
        y = torch.randint(0, 3, (len(x),))
        fgsm = FGSM(model, loss, lower_bound=0.0 if x.dim() == 4 else -float("inf"))
        pgd = PGD(model, loss)
        bound = {"lower_bound": 0.0} if x.dim() == 4 else {}
        out.append(
            (
                f"FGSM, {name}",
                lambda m=model, x=x, y=y, b=bound: (
                    methods.attack(
                        m, x, "fgsm", target=y, epsilon=0.03, loss="cross_entropy", **b
                    ).perturbed
                ),
                lambda f=fgsm, x=x, y=y: f.perturb(x, 0.03, y),
                floor(model, x, y, 1),
            )
        )
        out.append(
            (
                f"PGD Linf 10 steps, {name}",
                lambda m=model, x=x, y=y: (
                    methods.attack(
                        m,
                        x,
                        "pgd",
                        target=y,
                        radius=0.1,
                        step_size=0.02,
                        step_num=10,
                        loss="cross_entropy",
                    ).perturbed
                ),
                lambda p=pgd, x=x, y=y: p.perturb(
                    x, radius=0.1, step_size=0.02, step_num=10, target=y
                ),
                floor(model, x, y, 10),
            )
        )
    return out


def main() -> None:
    setup_torch()
    rows = []
    for name, ours, theirs, least in cases():
        diff = max_abs_diff(ours(), theirs())
        (t_ours, t_theirs), ratio = compare([ours, theirs], budget_s=10)
        (_, t_floor), _ = compare([ours, least], budget_s=10)
        rows.append([name, t_ours, t_theirs, ratio, t_floor, t_ours / t_floor, diff])
    headers = ["case", "ours ms", "Captum ms", "ours / Captum", "floor ms", "ours / floor"]
    print(table([*headers, "max abs diff"], rows))


if __name__ == "__main__":
    main()
