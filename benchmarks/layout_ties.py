"""What breaking ties as the model as given does costs: the benchmarks' CNN (max pooling),
gradient methods as they run now (as given: a max pooling routes the gradient) against the
same calls fed channels-last as before 2026-12-07 (ties broken by rounding, CPU by CPU), and
Captum, in one process.

Run: python -m benchmarks.layout_ties.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from captum.attr import DeepLift, IntegratedGradients, Saliency

import methods
from benchmarks.models import cnn
from benchmarks.timing import compare, setup_torch, table
from methods.engine import layout


def main() -> None:
    setup_torch()
    warnings.simplefilter("ignore")
    model, x = cnn(), torch.randn(8, 3, 64, 64)
    fed = cnn()
    fed.load_state_dict(model.state_dict())
    known = layout.routes_by_argmax
    # the rule before 2026-12-07 for ``fed`` alone: channels-last whatever routes the gradient
    layout.routes_by_argmax = lambda m: False if m is fed else known(m)  # type: ignore[assignment]
    layout._ROUTES[fed] = False
    cases: list[tuple[str, str, dict[str, Any], Callable[[], Any]]] = [
        ("saliency", "saliency", {}, lambda: Saliency(model).attribute(x, target=1)),
        ("integrated_gradients n=50", "integrated_gradients", {"n_steps": 50},
         lambda: IntegratedGradients(model).attribute(x, target=1, n_steps=50)),
        ("deeplift", "deeplift", {}, lambda: DeepLift(model).attribute(x, target=1)),
    ]  # fmt: skip
    rows = []
    try:
        for label, method, kw, captum in cases:

            def now(m: str = method, kw: dict[str, Any] = kw) -> Any:
                return methods.attribute(model, x, m, target=1, **kw).attributions

            def before(m: str = method, kw: dict[str, Any] = kw) -> Any:
                return methods.attribute(fed, x, m, target=1, **kw).attributions

            (t_now, t_before, t_captum), _ = compare([now, before, captum], budget_s=15)
            rows.append(["CNN 3x64x64 N=8", label, t_now, t_before, t_captum,
                         t_now / t_captum, t_before / t_captum])  # fmt: skip
    finally:
        layout.routes_by_argmax = known  # type: ignore[assignment]
    print(table(["case", "method", "now ms (as given)", "before ms (channels-last)",
                 "Captum ms", "now / Captum", "before / Captum"], rows))  # fmt: skip


if __name__ == "__main__":
    main()
