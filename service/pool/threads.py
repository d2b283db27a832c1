"""Torch thread counts: oversubscribed OpenMP pools make small ops ~50x slower.

On a small machine, a torch process whose intra-op pool spans every core spins and stalls as
soon as another process (the HTTP server, another worker) wants a core. Workers therefore
share the cores left after the server process, and the server process keeps one thread.
"""

from __future__ import annotations

import contextlib
import os


def cpu_count() -> int:
    """Cores this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def worker_threads(configured: int | None, n_workers: int) -> int:
    """``ATTRSERVE_TORCH_THREADS`` if set, else the cores but one shared among the workers."""
    if configured:
        return configured
    return max(1, (cpu_count() - 1) // max(1, n_workers))


def limit(threads: int) -> None:
    """Set torch's intra-op threads, and one inter-op thread (only settable before first use)."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
