"""Run the engine benchmarks side by side with Captum: ``python -m benchmarks``.

The HTTP load benchmark starts servers of its own: ``python -m benchmarks.load``.
"""

from __future__ import annotations

from benchmarks import bench_gradient, bench_layer, bench_perturbation

for name, module in (
    ("Gradient methods", bench_gradient),
    ("Perturbation methods", bench_perturbation),
    ("Layer methods", bench_layer),
):
    print(f"\n## {name}\n", flush=True)
    module.main()
