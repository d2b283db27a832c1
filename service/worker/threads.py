"""Torch thread counts: the cores a process may use, and setting its intra-op threads.

Oversubscribed OpenMP pools make small ops ~50x slower: a torch process whose intra-op pool
spans every core spins and stalls as soon as another process (the HTTP server, another worker)
wants a core. So the server process keeps one thread, and the workers share the cores batch
by batch (``service.pool.cores`` decides how many threads each batch computes on).
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_count(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Cores this process may use: the affinity mask, capped by a cgroup CPU quota if any."""
    if hasattr(os, "sched_getaffinity"):
        cores = len(os.sched_getaffinity(0))
    else:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    return max(1, cores if quota is None else min(cores, quota))


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> int | None:
    """Whole cores the cgroup's CPU quota allows (rounded up); None if unlimited or unknown.

    ``docker run --cpus=2.5`` (or a Kubernetes CPU limit) sets a quota but leaves the affinity
    mask at every core of the host, so a pool sized by the mask alone is throttled. Reads
    cgroup v2 ``cpu.max`` ("max 100000" or "250000 100000"), else cgroup v1
    ``cpu/cpu.cfs_quota_us`` and ``cpu/cpu.cfs_period_us`` (quota -1: unlimited), at ``root``:
    inside a container that is the container's own cgroup.
    """
    v2 = _read(root / "cpu.max")
    if v2 is not None:
        fields = v2.split()
        return _cores(fields[0], fields[1]) if len(fields) == 2 else None
    v1 = root / "cpu"
    return _cores(_read(v1 / "cpu.cfs_quota_us"), _read(v1 / "cpu.cfs_period_us"))


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _cores(quota: str | None, period: str | None) -> int | None:
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:  # "max", a missing file, or content we do not understand
        return None
    return math.ceil(q / p) if q > 0 and p > 0 else None


def use(threads: int) -> None:
    """Compute on ``threads`` intra-op threads from now on (a batch's count; cheap when it
    does not change)."""
    import torch

    if threads >= 1 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def limit(threads: int) -> None:
    """Set torch's intra-op threads, and one inter-op thread (only settable before first use)."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
