"""Explanations in production, what they cost: ``python -m benchmarks.production``
(``--quick``: fewer rows, shorter runs).

(1) Predict, and explain when it matters: image-cnn, batches of 32 images from 4 concurrent
    clients, integrated gradients (50 steps) on the examples ``explain_if`` chooses; examples
    per second with 10% explained (a probability threshold at the batch's 10th percentile),
    with all explained (``explain_if`` true), the attributions route on every example, and
    ``:predict`` alone (the floor).
(2) Dependence: tabular-mlp over 1,000 rows, its 8 features, a grid of 15: the engine's one
    batched forward per feature against scikit-learn's ``partial_dependence(method="brute")``
    on the same model (a forward per grid value), in one process.
(3) A summary of a 2,000-row attribution job: the GET's time.
(4) A drift monitor on the request path: tabular-mlp integrated gradients, one row a request
    from 4 clients, requests/s without a monitor and with one sampling every example; and the
    tap's own time per answer (flattening, the coin, the window), in this process.
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks.load import start, stop


def images(n: int, seed: int) -> list[Any]:
    from model_registry.builtin import image

    x, _ = image.make_data(n, torch.Generator().manual_seed(seed))
    noisy = x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
    return list(noisy.numpy().round(4).tolist())


async def rate(url: str, path: str, bodies: list[dict[str, Any]], seconds: float) -> float:
    """Examples per second of ``bodies`` posted round-robin by 4 clients for ``seconds``."""
    done = 0
    end = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def client(k: int) -> None:
            nonlocal done
            i = k
            while time.perf_counter() < end:
                body = bodies[i % len(bodies)]
                r = await c.post(path, json=body)
                r.raise_for_status()
                done += len(body.get("inputs") or body.get("instances"))
                i += 4

        t0 = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(4)))
        return done / (time.perf_counter() - t0)


def predictions_rows(url: str, seconds: float) -> list[str]:
    batches = [images(32, seed) for seed in range(8)]
    probs = []
    for b in batches:
        r = httpx.post(f"{url}/v1/models/image-cnn/predictions", json={"inputs": b}, timeout=60)
        probs += [p["probability"] for p in r.json()["predictions"]]
    cut = float(np.quantile(probs, 0.10))
    ig = {"method": "integrated_gradients", "params": {"n_steps": 50}}
    some = [{"inputs": b, "explain_if": f"probability < `{cut}`", **ig} for b in batches]
    every = [{"inputs": b, "explain_if": "`true`", **ig} for b in batches]
    route = [{"inputs": b, "target": "predicted", **ig} for b in batches]
    floor = [{"instances": b} for b in batches]
    chosen = sum(
        httpx.post(f"{url}/v1/models/image-cnn/predictions", json=b, timeout=60).json()["explained"]
        for b in some
    )
    runs = [
        ("predictions, 10% explained", "/v1/models/image-cnn/predictions", some),
        ("predictions, all explained", "/v1/models/image-cnn/predictions", every),
        ("attributions route, every example", "/v1/models/image-cnn/attributions", route),
        (":predict alone (the floor)", "/v1/models/image-cnn:predict", floor),
    ]
    found = [(name, asyncio.run(rate(url, path, bodies, seconds))) for name, path, bodies in runs]
    base = found[1][1]
    lines = [
        f"\n### Predict, explain where it matters (image-cnn, batches of 32, 4 clients; "
        f"{chosen} of {32 * len(batches)} chosen)\n",
        "| | examples/s | x all explained |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {r:.1f} | {r / base:.2f} |" for name, r in found]
    return lines


def dependence_rows(n: int) -> list[str]:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.inspection import partial_dependence

    import methods
    import model_registry

    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    model = model_registry.load(spec).model.eval()
    x = np.random.default_rng(0).normal(size=(n, 8)).astype(np.float32)

    class Served(ClassifierMixin, BaseEstimator):
        def fit(self, X: Any, y: Any) -> Any:
            self.classes_ = np.arange(3)
            return self

        def predict_proba(self, X: Any) -> Any:
            with torch.no_grad():
                return torch.softmax(model(torch.as_tensor(X)), -1).numpy()

    est = Served().fit(x, None)

    def sk() -> Any:
        return [partial_dependence(est, x, [f], method="brute", kind="both", grid_resolution=15)
                for f in range(8)]  # fmt: skip

    def ours() -> Any:
        return methods.partial_dependence(model, torch.from_numpy(x), list(range(8)), target=1,
                                          kind="both", output="probability")  # fmt: skip

    ref, got = sk(), ours()
    worst = max(
        float(np.abs(r["average"][1] - g.average).max()) for r, g in zip(ref, got, strict=True)
    )
    t_sk = min(_timed(sk) for _ in range(3))
    t_ours = min(_timed(ours) for _ in range(3))
    return [
        f"\n### Dependence: tabular-mlp, {n} rows, 8 features, grid 15, average and ICE\n",
        "| | s |",
        "|---|---|",
        f"| scikit-learn partial_dependence(method='brute') | {t_sk:.3f} |",
        f"| attrserve methods.partial_dependence | {t_ours:.3f} |",
        f"\nattrserve/scikit-learn: {t_ours / t_sk:.2f}; largest difference of the averages "
        f"{worst:.1e}",
    ]


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def summary_rows(url: str, n: int) -> list[str]:
    rows = np.random.default_rng(1).normal(size=(n, 8)).round(3).tolist()
    body = {"method": "integrated_gradients", "inputs": rows, "target": "predicted",
            "params": {"n_steps": 16}}  # fmt: skip
    job = httpx.post(f"{url}/v1/models/tabular-mlp/attribution-jobs", json=body, timeout=60).json()
    while httpx.get(f"{url}/v1/jobs/{job['id']}", timeout=60).json()["status"] != "succeeded":
        time.sleep(0.2)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        httpx.get(f"{url}/v1/jobs/{job['id']}/summary", timeout=60).raise_for_status()
        times.append(time.perf_counter() - t0)
    return [f"\nA summary of a {n}-row job (every label, mean_abs): {1e3 * min(times):.1f} ms"]


def monitor_rows(url: str, seconds: float) -> list[str]:
    rows = np.random.default_rng(3).normal(size=(400, 8)).round(3)
    bodies = [{"method": "integrated_gradients", "inputs": [r], "target": "predicted",
               "params": {"n_steps": 16}} for r in rows.tolist()]  # fmt: skip
    path = "/v1/models/tabular-mlp/attributions"
    where = f"{url}/v1/models/tabular-mlp/monitor"
    reference = {"reference": {"inputs": rows[:100].tolist()}, "window": 1000, "sample": 1.0}
    asyncio.run(rate(url, path, bodies, 1.0))  # warm
    off, on, seen = [], [], 0
    for _ in range(3):  # alternating, so the machine's drift hits both alike
        off.append(asyncio.run(rate(url, path, bodies, seconds / 6)))
        httpx.put(where, json=reference, timeout=60).raise_for_status()
        on.append(asyncio.run(rate(url, path, bodies, seconds / 6)))
        seen += httpx.delete(where, timeout=60).json()["seen"]
    tap_us = _tap_cost()
    latency_ms = 4e3 / float(np.median(off))  # 4 clients: a request's time in flight
    return [
        "\n### A drift monitor on the request path (tabular-mlp IG, a row a request, 4 clients)\n",
        "| | requests/s (median of 3, alternating) |",
        "|---|---|",
        f"| no monitor | {np.median(off):.1f} |",
        f"| monitor, every example sampled | {np.median(on):.1f} |",
        f"\nwith/without: {np.median(on) / np.median(off):.3f} ({seen} examples joined); the "
        f"tap itself: {tap_us:.1f} us an answer, {100 * tap_us / 1e3 / latency_ms:.3f}% of a "
        f"request ({latency_ms:.2f} ms in flight)",
    ]


def _tap_cost() -> float:
    """Microseconds the monitor's tap takes on one served answer of one row."""
    import tempfile
    from pathlib import Path

    import model_registry
    from service.core.reply import Reply
    from service.monitor.serving import served_rows
    from service.monitor.store import Monitor, Monitors

    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    store = Monitors(Path(tempfile.mkdtemp()))
    names = [f"x[{j}]" for j in range(8)]
    store.by_model[spec.id] = Monitor(
        model_id=spec.id, agg="mean_abs", sample=1.0, window=1000, ndcg_threshold=0.9,
        min_examples=100, features=names, reference={"low": [1.0] * 8}, source={},
    )  # fmt: skip
    reply = Reply(work_id=1, attributions=[np.random.rand(1, 8).astype(np.float32)], target=[1])
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        found = served_rows(spec, reply)
        assert found is not None
        store.observe(spec.id, found[1], found[0])
    return (time.perf_counter() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.production", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer rows, shorter runs")
    args = ap.parse_args(argv)
    seconds, rows, job_rows = (2.0, 200, 200) if args.quick else (15.0, 1000, 2000)
    lines = dependence_rows(rows)
    proc, url = start("attrserve", workers=1)
    try:
        lines += predictions_rows(url, seconds)
        lines += summary_rows(url, job_rows)
        lines += monitor_rows(url, seconds)
    finally:
        stop(proc)
    for line in lines:
        print(line, flush=True)
    return lines


if __name__ == "__main__":
    main()
