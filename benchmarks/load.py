"""HTTP load benchmark: attrserve (batching on and off) against a minimal Captum FastAPI server.

    python -m benchmarks.load [--clients 16] [--duration 5] [--max-requests 2000]
    python -m benchmarks.load --servers on --routes native,v1-explain,oip-explain,oip-infer
    python -m benchmarks.load --mixed --clients 24 [--duration 20 --repeat 3]

N concurrent keep-alive connections send identical-shape requests (one example each) for a bounded
duration and count; throughput and p50/p99 latency are printed per server, model and method.
The "HTTP overhead" line is one client's p50 latency minus the server-reported compute time
for one small request. Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from pydantic import BaseModel

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = [
    ("tabular-mlp", "saliency"),
    ("tabular-mlp", "integrated_gradients"),
    ("image-cnn", "saliency"),
    ("image-cnn", "integrated_gradients"),
]


# -- the server a user would otherwise write ---------------------------------------------------
class Req(BaseModel):
    method: str
    inputs: list[Any]
    target: int


def minimal_app() -> Any:
    """FastAPI + Captum directly: one request, one Captum call (no batching, no workers)."""
    import torch
    from captum.attr import IntegratedGradients, Saliency
    from fastapi import FastAPI

    import model_registry

    wanted = {model for model, _ in SCENARIOS}
    models = {
        s.id: model_registry.load(s).model for s in model_registry.builtin_specs() if s.id in wanted
    }
    app = FastAPI()

    @app.post("/v1/models/{model_id}/attributions")
    def attribute(model_id: str, req: Req) -> dict[str, Any]:
        t0 = time.perf_counter()
        model = models[model_id]
        x = torch.tensor(req.inputs, dtype=torch.float32)
        if req.method == "saliency":
            a = Saliency(model).attribute(x, target=req.target)
        else:
            a = IntegratedGradients(model).attribute(x, target=req.target)
        compute = (time.perf_counter() - t0) * 1e3
        return {"attributions": a.tolist(), "timing_ms": {"compute": compute}}

    return app


def serve_route(port: int) -> None:
    """attrserve with every attribution request through its FastAPI route (no fast path):
    what ``service.attributions.fastpath`` is measured against."""
    import uvicorn

    from service.app import create_app
    from service.core.settings import Settings

    app = create_app(Settings.from_env(port=port))
    app.fast_path = None
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- servers -----------------------------------------------------------------------------------
def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    kind: str, argv: list[str] | None = None, **settings: Any
) -> tuple[subprocess.Popen[bytes], str]:
    """A server in a subprocess and its URL: ``kind`` "minimal" (the Captum FastAPI server
    above), "route" (attrserve without its fast path), "peer" (``python -m *argv PORT``, a
    FastAPI app with /docs), else attrserve with ``settings`` as ATTRSERVE_ variables."""
    port = _port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    env.update({f"ATTRSERVE_{k.upper()}": str(v) for k, v in settings.items()})
    env["ATTRSERVE_LOG_LEVEL"] = "warning"
    if kind == "minimal":
        cmd = [sys.executable, "-m", "benchmarks.load", "--serve-minimal", str(port)]
    elif kind == "peer":
        cmd = [sys.executable, "-m", *(argv or []), str(port)]
    elif kind == "route":
        cmd = [sys.executable, "-m", "benchmarks.load", "--serve-route", str(port)]
    else:
        cmd = [sys.executable, "-m", "service.cli.main", "serve", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    probe = "/docs" if kind in ("minimal", "peer") else "/v1/health/ready"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(url + probe, timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"{kind} server did not start")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- load --------------------------------------------------------------------------------------
#: how each route asks for the same work (one example, target 0): the native attributions
#: route, KServe V1 explain, OIP explain (JSON tensors), and predictions (OIP infer, V1 predict)
ROUTES = ("native", "v1-explain", "oip-explain", "oip-infer", "v1-predict")
PREDICTIONS = ("oip-infer", "v1-predict")
INPUT_NAMES = {"tabular-mlp": "x", "image-cnn": "image"}


def body(
    model: str, method: str, rng: np.random.Generator, route: str = "native"
) -> tuple[str, dict[str, Any]]:
    """The request path and body of one scenario on one route."""
    shape = (1, 8) if model == "tabular-mlp" else (1, 3, 32, 32)
    x = rng.random(shape, dtype=np.float32)
    tensor = {
        "name": INPUT_NAMES[model],
        "shape": list(shape),
        "datatype": "FP32",
        "data": x.reshape(-1).tolist(),
    }
    if route == "v1-explain":
        params = {"method": method, "target": 0}
        return f"/v1/models/{model}:explain", {"instances": x.tolist(), "parameters": params}
    if route == "oip-explain":
        params = {"method": method, "target": 0}
        return f"/v2/models/{model}/explain", {"inputs": [tensor], "parameters": params}
    if route == "oip-infer":
        return f"/v2/models/{model}/infer", {"inputs": [tensor]}
    if route == "v1-predict":
        return f"/v1/models/{model}:predict", {"instances": x.tolist()}
    body = {"method": method, "inputs": x.tolist(), "target": 0}
    return f"/v1/models/{model}/attributions", body


class Conn:
    """A bare keep-alive HTTP/1.1 connection: the load generator must not eat the machine.

    httpx's AsyncClient costs ~4.5 ms of CPU per request, more than the servers it measures;
    this costs a fraction, so the servers (not the client) set the numbers.
    """

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        )
        self.writer.write(head.encode() + payload)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = dict(h.split(":", 1) for h in lines[1:] if ":" in h)
        length = {k.strip().lower(): v.strip() for k, v in headers.items()}.get("content-length")
        if length is None:
            raise RuntimeError("the benchmark client needs responses with content-length")
        return status, await self.reader.readexactly(int(length))

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()


async def load(
    url: str,
    model: str,
    method: str,
    clients: int,
    duration: float,
    max_requests: int,
    route: str = "native",
) -> dict[str, float]:
    rng = np.random.default_rng(0)
    requests = [body(model, method, rng, route) for _ in range(64)]
    path = requests[0][0]
    bodies = [orjson.dumps(b) for _, b in requests]
    latencies: list[float] = []
    computes: list[float] = []
    errors = 0
    host, port = url.removeprefix("http://").split(":")

    async def client(i: int, conn: Conn, end: float) -> None:
        nonlocal errors
        k = i
        while time.perf_counter() < end and len(latencies) + errors < max_requests:
            t0 = time.perf_counter()
            status, data = await conn.post(path, bodies[k % len(bodies)])
            if status == 200:
                latencies.append((time.perf_counter() - t0) * 1e3)
                timing = orjson.loads(data).get("timing_ms")  # OIP and predict have none
                computes.append(float(timing["compute"]) if timing else float("nan"))
            else:
                errors += 1
            k += clients

    conns = [Conn(host, int(port)) for _ in range(clients)]
    try:
        for b in bodies[:3]:  # warm up
            await conns[0].post(path, b)
        started = time.perf_counter()
        end = started + duration
        await asyncio.gather(*(client(i, c, end) for i, c in enumerate(conns)))
        elapsed = time.perf_counter() - started
    finally:
        for c in conns:
            await c.close()
    lat = np.array(latencies or [float("nan")])
    return {
        "rps": len(latencies) / elapsed,
        "p50": float(np.percentile(lat, 50)),
        "p99": float(np.percentile(lat, 99)),
        "n": len(latencies),
        "errors": errors,
        "compute_p50": statistics.median(computes) if computes else float("nan"),
    }


#: the mixed workload: one-example saliency (cheap) beside 8-image IG and occlusion (expensive)
IMAGE = (1, 3, 32, 32)
MIXED: dict[str, dict[str, Any]] = {
    "cheap saliency": {"method": "saliency"},
    "image IG x8": {"method": "integrated_gradients", "params": {"n_steps": 50}, "n": 8},
    "occlusion x8": {
        "method": "occlusion",
        "params": {"sliding_window_shapes": [3, 8, 8], "strides": [3, 4, 4]},
        "n": 8,
    },
}


async def mixed(url: str, clients: int, duration: float) -> dict[str, dict[str, float]]:
    """Half the clients send cheap saliency, the others expensive work (IG and occlusion in
    turn), to image-cnn; latency per kind and throughput (requests and examples per second)."""
    rng = np.random.default_rng(0)
    host, port = url.removeprefix("http://").split(":")
    path = "/v1/models/image-cnn/attributions"

    def payload(kind: str) -> bytes:
        spec = dict(MIXED[kind])
        n = int(spec.pop("n", 1))
        x = rng.random((n, *IMAGE[1:]), dtype=np.float32)
        # base64 tensors, as a client sending images would (nested JSON lists of 24,576
        # floats cost the server's event loop ~100 ms to parse: that, not the queue, would set
        # the cheap requests' tail)
        tensor = {
            "dtype": "float32",
            "shape": list(x.shape),
            "b64": base64.b64encode(x.tobytes()).decode(),
        }
        return orjson.dumps({**spec, "inputs": tensor, "target": 0})

    bodies = {kind: payload(kind) for kind in MIXED}
    latencies: dict[str, list[float]] = {kind: [] for kind in MIXED}
    errors = 0

    async def client(i: int, conn: Conn, end: float) -> None:
        nonlocal errors
        kinds = ["cheap saliency"] if i % 2 == 0 else ["image IG x8", "occlusion x8"]
        k = i
        while time.perf_counter() < end:
            kind = kinds[k % len(kinds)]
            t0 = time.perf_counter()
            status, _ = await conn.post(path, bodies[kind])
            if status == 200:
                latencies[kind].append((time.perf_counter() - t0) * 1e3)
            else:
                errors += 1
            k += 1

    conns = [Conn(host, int(port)) for _ in range(clients)]
    try:
        for kind in MIXED:  # warm up (and let the pool learn the model's rate)
            await conns[0].post(path, bodies[kind])
        started = time.perf_counter()
        await asyncio.gather(*(client(i, c, started + duration) for i, c in enumerate(conns)))
        elapsed = time.perf_counter() - started
    finally:
        for c in conns:
            await c.close()
    out: dict[str, dict[str, float]] = {}
    for kind, lat in latencies.items():
        arr = np.array(lat or [float("nan")])
        n = int(MIXED[kind].get("n", 1))
        out[kind] = {
            "rps": len(lat) / elapsed,
            "examples": len(lat) * n / elapsed,
            "p50": float(np.percentile(arr, 50)),
            "p90": float(np.percentile(arr, 90)),
            "p99": float(np.percentile(arr, 99)),
        }
    out["errors"] = {"n": float(errors)}
    return out


def run_mixed(args: argparse.Namespace) -> None:
    """Cheap requests first: the mixed workload with splitting and cost order off (the queue
    first come first served, ``ATTRSERVE_SPLIT_MS=0``) and on (the default)."""
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, split_ms in (("FIFO, whole requests", 0), ("cheap first, 100 ms pieces", 100)):
        proc, url = start("attrserve", workers=args.workers, split_ms=split_ms)
        try:
            rounds = [asyncio.run(mixed(url, args.clients, args.duration))]
            for _ in range(args.repeat - 1):
                rounds.append(asyncio.run(mixed(url, args.clients, args.duration)))
        finally:
            stop(proc)
        total = [sum(r[k]["examples"] for k in MIXED) for r in rounds]
        results[label] = rounds[sorted(range(len(rounds)), key=total.__getitem__)[len(rounds) // 2]]
    print(
        f"\n| queue ({args.clients} clients, image-cnn) | kind | req/s | p50 ms | p90 ms | p99 ms |"
    )
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        for kind in MIXED:
            k = r[kind]
            print(
                f"| {label} | {kind} | {k['rps']:.1f} | {k['p50']:.0f} | {k['p90']:.0f} "
                f"| {k['p99']:.0f} |"
            )
        examples = sum(r[kind]["examples"] for kind in MIXED)
        print(f"| {label} | all (examples/s) | {examples:.1f} | | | |")
    before, after = results.values()
    ex = [sum(r[k]["examples"] for k in MIXED) for r in (before, after)]
    print(
        f"\ncheap p50 {before['cheap saliency']['p50']:.0f} -> "
        f"{after['cheap saliency']['p50']:.0f} ms, p99 {before['cheap saliency']['p99']:.0f} -> "
        f"{after['cheap saliency']['p99']:.0f} ms; examples/s after/before = {ex[1] / ex[0]:.2f}"
    )


def plan(
    scenarios: list[tuple[str, str]], routes: list[str], clients: int
) -> list[tuple[str, str, str, int]]:
    """(model, method, route, clients) to run: attribution routes per scenario, side by side;
    prediction routes once per model."""
    out: list[tuple[str, str, str, int]] = []
    predicted: set[tuple[str, str, int]] = set()
    for model, method in scenarios:
        for c in sorted({1, clients}):
            for route in routes:
                if route in PREDICTIONS:
                    if (model, route, c) in predicted:
                        continue
                    predicted.add((model, route, c))
                out.append((model, method, route, c))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.load", description=__doc__)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per scenario")
    p.add_argument("--max-requests", type=int, default=5000, help="cap per scenario")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--threads", type=int, default=0, help="ATTRSERVE_TORCH_THREADS (0: attrserve's rule)"
    )
    p.add_argument("--only", default="", help="run only scenarios whose 'model/method' has this")
    p.add_argument(
        "--servers",
        default="on,off,minimal",
        help="subset of on,off,minimal,route (route: attrserve without its fast path)",
    )
    p.add_argument(
        "--routes",
        default="native",
        help=f"attrserve routes to load, a subset of {','.join(ROUTES)} (predict routes run "
        "once per model)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds over the routes, interleaved; the table shows each row's median round "
        "(routes compared in one server, under the same drift)",
    )
    p.add_argument(
        "--mixed",
        action="store_true",
        help="the mixed workload (cheap saliency beside expensive IG and occlusion), with the "
        "queue first come first served and then cheap first",
    )
    p.add_argument("--serve-minimal", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--serve-route", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_route is not None:
        serve_route(args.serve_route)
        return
    if args.mixed:
        run_mixed(args)
        return
    if args.serve_minimal is not None:
        import uvicorn

        uvicorn.run(minimal_app(), host="127.0.0.1", port=args.serve_minimal, log_level="warning")
        return
    every = {
        "on": ("attrserve (batching on)", "attrserve", {"batching": "true"}),
        "route": ("attrserve, FastAPI route only", "route", {"batching": "true"}),
        "off": ("attrserve (batching off)", "attrserve", {"batching": "false"}),
        "minimal": ("minimal FastAPI+Captum", "minimal", {}),
    }
    ours = {"workers": args.workers, **({"torch_threads": args.threads} if args.threads else {})}
    servers = {
        name: (kind, {**settings, **ours} if kind != "minimal" else settings)
        for short, (name, kind, settings) in every.items()
        if short in args.servers.split(",")
    }
    scenarios = [(m, me) for m, me in SCENARIOS if args.only in f"{m}/{me}"]
    rows: list[tuple[str, str, str, int, dict[str, float]]] = []
    overhead: dict[str, float] = {}
    for name, (kind, settings) in servers.items():
        proc, url = start(kind, **settings)
        try:
            one = asyncio.run(load(url, "tabular-mlp", "saliency", 1, min(2.0, args.duration), 500))
            overhead[name] = one["p50"] - one["compute_p50"]
            routes = args.routes.split(",") if kind != "minimal" else ["native"]
            runs = plan(scenarios, routes, args.clients)
            rounds: dict[int, list[dict[str, float]]] = {i: [] for i in range(len(runs))}
            for _ in range(args.repeat):  # interleaved: every route sees the same drift
                for i, (model, method, route, clients) in enumerate(runs):
                    rounds[i].append(
                        asyncio.run(
                            load(
                                url, model, method, clients, args.duration, args.max_requests, route
                            )
                        )
                    )
            for i, (model, method, route, clients) in enumerate(runs):
                label = name if route == "native" else f"{name} {route}"
                shown = "-" if route in PREDICTIONS else method
                r = sorted(rounds[i], key=lambda x: x["rps"])[len(rounds[i]) // 2]
                rows.append((label, model, shown, clients, r))
                print(
                    f"{label:26} {model:12} {shown:21} c={clients:<3} "
                    f"{r['rps']:8.1f} req/s  p50 {r['p50']:7.2f} ms  "
                    f"p99 {r['p99']:7.2f} ms  errors {r['errors']}",
                    flush=True,
                )
        finally:
            stop(proc)
    print("\n| server | model | method | clients | req/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|")
    for name, model, method, clients, r in rows:
        print(
            f"| {name} | {model} | {method} | {clients} | {r['rps']:.1f} | {r['p50']:.2f} "
            f"| {r['p99']:.2f} |"
        )
    print("\nHTTP overhead, one client, tabular saliency (p50 latency - p50 compute):")
    for name, ms in overhead.items():
        print(f"  {name:26} {ms:6.2f} ms")
    by = {(n, mo, me, c): r["rps"] for n, mo, me, c, r in rows}
    key = ("tabular-mlp", "integrated_gradients", args.clients)
    on = by.get(("attrserve (batching on)", *key), float("nan"))
    off = by.get(("attrserve (batching off)", *key), float("nan"))
    mini = by.get(("minimal FastAPI+Captum", *key), float("nan"))
    print(
        f"\ntabular IG at {args.clients} clients: batching on/off = {on / off:.2f}x, "
        f"on/minimal Captum = {on / mini:.2f}x"
    )


if __name__ == "__main__":
    main()
