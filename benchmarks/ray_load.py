"""Ray Serve (N replicas of the app) against our own server, under the same HTTP load.

    python -m benchmarks.ray_load [--replicas 1,2] [--clients 8,16] [--duration 5]

Our server: ``attrserve serve`` with one worker (batching on). Ray Serve: a local Ray instance
with ``service.cli.ray``'s deployment, each replica one worker on one torch thread, requests
through Ray's HTTP proxy. The load is ``benchmarks.load``'s (bare keep-alive connections, one
example per request, tabular integrated gradients by default). Not a timed test: on a small
machine Ray's proxy, controller and replicas compete with the workers for the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from benchmarks.load import load, start, stop


def measure(url: str, model: str, method: str, clients: list[int], duration: float) -> list[Any]:
    return [
        (c, asyncio.run(load(url, model, method, c, duration, max_requests=20000))) for c in clients
    ]


def ray_rows(
    replicas: int, model: str, method: str, clients: list[int], duration: float
) -> list[Any]:
    import ray
    from ray import serve

    from benchmarks.load import _port
    from service.cli import ray as ray_cli
    from service.core.settings import Settings

    ray.init(
        num_cpus=replicas, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR
    )
    try:
        port = _port()
        serve.start(
            http_options={"host": "127.0.0.1", "port": port},
            logging_config={"log_level": "WARNING"},
        )
        settings = Settings.from_env(log_level="warning")
        serve.run(ray_cli.application(settings, replicas=replicas), name=ray_cli.APP_NAME)
        return measure(f"http://127.0.0.1:{port}", model, method, clients, duration)
    finally:
        serve.shutdown()
        ray.shutdown()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="benchmarks.ray_load", description=__doc__)
    p.add_argument("--replicas", default="2", help="Ray Serve replica counts, comma-separated")
    p.add_argument("--clients", default="8,16", help="concurrent clients, comma-separated")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per row")
    p.add_argument("--model", default="tabular-mlp")
    p.add_argument("--method", default="integrated_gradients")
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rows: list[tuple[str, int, dict[str, float]]] = []
    proc, url = start("attrserve", workers=1, batching="true")
    try:
        for c, r in measure(url, args.model, args.method, clients, args.duration):
            rows.append(("attrserve serve (1 worker)", c, r))
    finally:
        stop(proc)
    for n in (int(r) for r in args.replicas.split(",")):
        for c, r in ray_rows(n, args.model, args.method, clients, args.duration):
            rows.append((f"Ray Serve, {n} replica{'s' if n > 1 else ''}", c, r))
    print(f"\n{args.model} {args.method}, one example per request\n")
    print("| server | clients | req/s | p50 ms | p99 ms | errors |")
    print("|---|---|---|---|---|---|")
    for name, c, r in rows:
        print(
            f"| {name} | {c} | {r['rps']:.1f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['errors']} |"
        )


if __name__ == "__main__":
    main()
