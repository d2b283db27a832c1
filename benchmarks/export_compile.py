"""Exported and compiled attribution steps vs eager ``methods.attribute`` (issue 14).

Run: python -m benchmarks.export_compile. Saliency and integrated gradients (n_steps 50) on
the benchmark CNN at batch 8 and 64, on the CPU, in float32, in one process. Columns, as
ratios of the eager call's time (warm medians, ``timing.interleaved_ms``):

- exported: ``methods.export``'s program (``.module()``), the aten graph of forward and
  backward run by torch's eager interpreter, without the engine's Python;
- compiled model: ``methods.attribute`` on ``torch.compile(model)`` (what models.toml's
  ``compile = true`` does), dynamic batch;
- compiled export: the exported program's module under ``torch.compile`` (Inductor).

Every variant is checked against the eager attributions first (max |diff| column).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

import methods
from benchmarks.models import cnn
from benchmarks.timing import interleaved_ms, max_abs_diff, setup_torch, table

TARGET = 1
CASES: list[tuple[str, dict[str, Any]]] = [
    ("saliency", {}),
    ("integrated_gradients", {"n_steps": 50}),
]
BATCHES = (8, 64)


def _variants(
    model: Any,
    compiled_model: Any,
    module: Any,
    compiled_program: Any,
    method: str,
    params: dict[str, Any],
    x: torch.Tensor,
) -> dict[str, Callable[[], Any]]:
    def eager() -> Any:
        return methods.attribute(model, x, method, target=TARGET, **params).attributions

    def compiled() -> Any:
        return methods.attribute(compiled_model, x, method, target=TARGET, **params).attributions

    return {
        "eager": eager,
        "exported": lambda: module(x),
        "compiled model": compiled,
        "compiled export": lambda: compiled_program(x),
    }


def main() -> None:
    setup_torch()
    warnings.simplefilter("ignore")
    model = cnn()
    compiled_model = torch.compile(model, dynamic=True)
    rows: list[list[object]] = []
    for method, params in CASES:
        t0 = time.perf_counter()
        program = methods.export(model, method, torch.randn(4, 3, 64, 64), target=TARGET, **params)
        export_s = time.perf_counter() - t0
        module = program.module()
        compiled_program = torch.compile(module, dynamic=True)
        for n in BATCHES:
            x = torch.randn(n, 3, 64, 64)
            fns = _variants(model, compiled_model, module, compiled_program, method, params, x)
            want = fns["eager"]()
            diffs = {k: max_abs_diff(fn(), want) for k, fn in fns.items() if k != "eager"}
            ms = interleaved_ms(list(fns.values()), repeat=10, budget_s=20)
            base = ms[0]
            label = method if not params else f"{method} n_steps={params['n_steps']}"
            rows.append(
                [
                    label,
                    n,
                    base,
                    *(m / base for m in ms[1:]),
                    max(diffs.values()),
                    export_s,
                ]
            )
    print(
        table(
            [
                "method",
                "N",
                "eager ms",
                "exported / eager",
                "compiled model / eager",
                "compiled export / eager",
                "max |diff|",
                "export s",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
