"""Run the engine benchmarks side by side with Captum: ``python -m benchmarks``.

Then the real-size models (``benchmarks.real --quick``: BERT-base, DistilBERT, ViT-B/16,
ResNet-50, GPT-2 small; ~5 minutes on a 2-core CPU) and a model behind a real KServe predictor
(``benchmarks.remote``). The HTTP load benchmark starts servers of its own:
``python -m benchmarks.load``.
"""

from __future__ import annotations

from benchmarks import bench_gradient, bench_layer, bench_perturbation, real, remote

for name, module in (
    ("Gradient methods", bench_gradient),
    ("Perturbation methods", bench_perturbation),
    ("Layer methods", bench_layer),
):
    print(f"\n## {name}\n", flush=True)
    module.main()
real.main(["--quick"])
remote.main([])
