"""Attribution jobs beside synchronous traffic, and bulk throughput three ways.

    python -m benchmarks.jobs [--images 2000] [--clients 8] [--duration 5]

(1) Synchronous tabular IG, p50/p99 at N clients, without and with a long image job running.
(2) Occlusion over N images: examples/s as one job, as synchronous requests of 100 images
    (4 at a time), and with the offline CLI (``attrserve attribute``), on the same machine.
(3) The job path's CPU: 2,000 tabular IG rows as one job (submit, run, fetch the JSON
    result), the server's and the worker's CPU time (/proc), against the engine called
    directly on the same rows in this process (warm, one thread, as the worker computes).
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.load import load, start, stop

OCCLUSION = {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}


def images(n: int) -> np.ndarray:
    import torch

    from model_registry.builtin import image

    x, _ = image.make_data(n, torch.Generator().manual_seed(1))
    return x.numpy().astype(np.float32)


def b64(x: np.ndarray) -> dict[str, Any]:
    raw = np.ascontiguousarray(x, dtype="<f4").tobytes()
    return {"dtype": "float32", "shape": list(x.shape), "b64": base64.b64encode(raw).decode()}


def job_body(x: np.ndarray) -> dict[str, Any]:
    return {"method": "occlusion", "inputs": b64(x), "target": 0, "params": OCCLUSION}


def run_job(c: httpx.Client, x: np.ndarray) -> tuple[str, float]:
    t0 = time.perf_counter()
    r = c.post("/v1/models/image-cnn/attribution-jobs", json=job_body(x))
    r.raise_for_status()
    job_id = r.json()["id"]
    while c.get(f"/v1/jobs/{job_id}").json()["status"] not in ("succeeded", "failed", "cancelled"):
        time.sleep(0.05)
    return job_id, time.perf_counter() - t0


async def sync_bulk(url: str, x: np.ndarray, per_request: int, concurrency: int) -> float:
    parts = [x[i : i + per_request] for i in range(0, len(x), per_request)]
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:

        async def one(part: np.ndarray) -> None:
            async with sem:
                r = await c.post("/v1/models/image-cnn/attributions", json=job_body(part))
                r.raise_for_status()

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in parts))
        return time.perf_counter() - t0


def cli(x: np.ndarray) -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "x.npy", Path(tmp) / "out.npz"
        np.save(src, x)
        cmd = [
            sys.executable,
            "-m",
            "service.cli.main",
            "attribute",
            "--model",
            "image-cnn",
            "--method",
            "occlusion",
            "--inputs",
            str(src),
            "--output",
            str(out),
            "--target",
            "0",
            "--params",
            '{"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}',
            "--quiet",
        ]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print("CLI failed:", done.stderr.strip()[-300:])
            return None
        return time.perf_counter() - t0


def cpu_s(pid: int) -> float:
    """A process's user + system CPU time so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def job_cpu(
    c: httpx.Client, server_pid: int, x: np.ndarray, reps: int, fmt: str = "json"
) -> tuple[float, float]:
    """Mean CPU seconds (server, tabular-mlp's worker) per job over ``x``, its result fetched
    as ``fmt`` (json, gzipped as httpx asks; or npz), after two warm-up jobs (the first
    teaches the pool the model's rate)."""
    workers = [w["pid"] for w in c.get("/v1/health/ready").json()["workers"]]
    body = {"method": "integrated_gradients", "inputs": x.tolist(), "target": 0}
    server = worker = 0.0
    for rep in range(reps + 2):
        before = cpu_s(server_pid), sum(cpu_s(p) for p in workers)
        r = c.post("/v1/models/tabular-mlp/attribution-jobs", json=body)
        r.raise_for_status()
        job_id = r.json()["id"]
        while c.get(f"/v1/jobs/{job_id}").json()["status"] not in ("succeeded", "failed"):
            time.sleep(0.05)
        c.get(f"/v1/jobs/{job_id}/result", params={"format": fmt}).raise_for_status()
        if rep >= 2:
            server += cpu_s(server_pid) - before[0]
            worker += sum(cpu_s(p) for p in workers) - before[1]
    return server / reps, worker / reps


def engine_cpu(x: np.ndarray, reps: int) -> float:
    """CPU seconds of ``methods.attribute`` over ``x`` (tabular IG), warm, one thread."""
    import torch

    import methods
    import model_registry

    torch.set_num_threads(1)
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tabular-mlp"]
    model, xt = model_registry.load(spec).model, torch.from_numpy(x)
    runs = []
    for _ in range(reps + 1):
        t0 = time.process_time()
        methods.attribute(model, xt, "integrated_gradients", target=0, internal_batch_size=512)
        runs.append(time.process_time() - t0)
    return float(np.median(runs[1:]))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.jobs", description=__doc__)
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=10, help="jobs measured for (3)")
    args = p.parse_args(argv)
    x = images(args.images)
    tmp = tempfile.mkdtemp(prefix="attrserve-bench-")
    proc, url = start("attrserve", workers=1, data_dir=tmp, batching="true")
    rows: list[str] = []
    try:
        c = httpx.Client(base_url=url, timeout=600)
        quiet = asyncio.run(
            load(url, "tabular-mlp", "integrated_gradients", args.clients, args.duration, 10**6)
        )
        long_x = np.concatenate([x] * 5)  # runs past the measurement
        r = c.post("/v1/models/image-cnn/attribution-jobs", json=job_body(long_x))
        r.raise_for_status()
        job_id = r.json()["id"]
        time.sleep(1.0)
        busy = asyncio.run(
            load(url, "tabular-mlp", "integrated_gradients", args.clients, args.duration, 10**6)
        )
        progress = c.get(f"/v1/jobs/{job_id}").json()["progress"]
        c.delete(f"/v1/jobs/{job_id}")
        rows.append("| synchronous tabular IG | clients | req/s | p50 ms | p99 ms |")
        rows.append("|---|---|---|---|---|")
        for name, res in (("no job", quiet), ("a long image job running", busy)):
            rows.append(
                f"| {name} | {args.clients} | {res['rps']:.1f} | {res['p50']:.2f} "
                f"| {res['p99']:.2f} |"
            )
        rows.append(
            f"\n(the job meanwhile: {progress['done']} of {progress['total']} images; "
            f"p99 ratio {busy['p99'] / quiet['p99']:.2f})\n"
        )
        _, job_s = run_job(c, x)
        sync_s = asyncio.run(sync_bulk(url, x, 100, 4))
        rows_x = np.random.default_rng(0).normal(size=(2000, 8)).astype(np.float32)
        cpu = {fmt: job_cpu(c, proc.pid, rows_x, args.reps, fmt) for fmt in ("json", "npz")}
    finally:
        stop(proc)
    cli_s = cli(x)
    rows.append(f"| occlusion over {args.images} images | seconds | images/s |")
    rows.append("|---|---|---|")
    for name, secs in (
        ("one attribution job", job_s),
        ("synchronous requests of 100 (4 at a time)", sync_s),
        ("offline CLI (attrserve attribute)", cli_s),
    ):
        if secs is not None:
            rows.append(f"| {name} | {secs:.2f} | {args.images / secs:.1f} |")
    engine_s = engine_cpu(rows_x, args.reps)
    rows.append("\n| 2,000 tabular IG rows | CPU ms | x engine |")
    rows.append("|---|---|---|")
    rows.append(f"| engine called directly (warm, one thread) | {engine_s * 1e3:.1f} | 1.00 |")
    for fmt, (server_s, worker_s) in cpu.items():
        for name, secs in (
            ("the worker", worker_s),
            ("the server (HTTP in and out, store, chunks)", server_s),
            ("in all", worker_s + server_s),
        ):
            rows.append(
                f"| job, result as {fmt}: {name} | {secs * 1e3:.1f} | {secs / engine_s:.2f} |"
            )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
