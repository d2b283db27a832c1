"""Timing helpers shared by the benchmarks: medians of repeated runs in one process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


def interleaved_ms(
    fns: list[Callable[[], Any]], repeat: int, budget_s: float, block: int = 4
) -> list[float]:
    """Warm medians of ``fns``, timed in alternating blocks of ``block`` consecutive calls.

    Blocks alternate so a shared machine's load hits all alike; within a block only the calls
    after the first are kept. Timing single calls round-robin instead measures every call with
    caches just cooled by the other library: a fixed cost (measured here: ~0.3-0.6 ms per
    call) that swamps sub-millisecond calls and barely shows on slow ones, so it would rank
    the fast side by cache misses rather than work. A server answering requests, or a loop
    over batches, runs warm.
    """
    blocks = []
    for fn in fns:
        # Warm-up: lazy initialisation, the allocator's arenas, Python's caches. A young
        # process runs small calls measurably slower (~0.48 vs ~0.40 ms here) for a while.
        warm_until = time.perf_counter() + 1.0
        for _ in range(50):
            t0 = time.perf_counter()
            fn()
            took = time.perf_counter() - t0
            if took > 0.1 or time.perf_counter() > warm_until:
                break
        # Calls of a tenth of a second or more are not moved by cold caches: one per block.
        blocks.append(1 if took > 0.1 else block)
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    while len(times[0]) < repeat and (time.perf_counter() - start < budget_s or len(times[0]) < 3):
        for fn, ts, n in zip(fns, times, blocks, strict=True):
            for i in range(n):
                t0 = time.perf_counter()
                fn()
                if i or n == 1:
                    ts.append((time.perf_counter() - t0) * 1e3)
    return [statistics.median(ts) for ts in times]


def compare(fns: list[Callable[[], Any]], budget_s: float = 30) -> tuple[list[float], float]:
    """Warm medians of ``fns`` (``interleaved_ms``) and the ratio ``fns[0] / fns[1]``.

    Sub-millisecond timings drift by up to 2x from one measurement to the next in a young
    process (seen here: feature_ablation 0.53, then 0.28, 0.32 ms), so fast cases take the
    median of three rounds (the ratio is the median round's); a slow case's single round
    already spans many seconds.
    """
    rounds = [interleaved_ms(fns, repeat=30, budget_s=budget_s)]
    if rounds[0][0] < 100:
        rounds += [interleaved_ms(fns, repeat=30, budget_s=budget_s) for _ in range(2)]
    ratio = statistics.median(r[0] / r[1] for r in rounds)
    return [statistics.median(v) for v in zip(*rounds, strict=True)], ratio


def max_abs_diff(a: Any, b: Any) -> float:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return max(float((x.detach() - y.detach()).abs().max()) for x, y in zip(a, b, strict=True))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e-2 or abs(v) >= 1e4 else f"{v:.3f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def setup_torch() -> None:
    torch.manual_seed(0)
