"""The cores the workers share, handed out per batch as torch intra-op threads.

The rule (measured with ``benchmarks.load`` and an engine sweep on a 2-core machine, see
docs/operations.md "Threads follow the work"):

* a batch expected to compute for less than ``PARALLEL_MS`` runs on one thread: its tensors
  are too small for torch to split, and an OpenMP team's wake-ups cost more than they save
  (tabular IG over 16 examples: 0.58 ms on one thread, 0.78 ms on two);
* a bigger batch gets every core no other worker's running batch holds, at least one
  (image-CNN IG over 16 examples: 219 ms on one thread, 84 ms on two; HTTP image IG at 16
  clients: 79 -> 138-178 req/s);
* so one busy group computes on every core, and many groups with small requests compute side
  by side, one core each: processes for many small requests, threads for big batches.

A batch's threads are decided when it is sent. Work of more than a piece goes only to an idle
worker, so it starts at once and the count is exact; a cheap batch in a worker's ready slot
gets one thread anyway. What a worker holds is the count of the batch it is computing (the
head of its ``outstanding``), so a lost worker or a finished batch frees its cores with no
bookkeeping of their own. ``ATTRSERVE_TORCH_THREADS`` fixes the count instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from service.pool.records import Worker

#: estimated compute (ms, on the threads it was measured with) from which a batch gets more
#: than one thread
PARALLEL_MS = 2.0


class Cores:
    """``total``: cores the workers share; ``fixed``: every batch's count (no sharing);
    ``workers``: every worker of every group now (what the others hold)."""

    def __init__(
        self, total: int, fixed: int | None, workers: Callable[[], Iterable[Worker]]
    ) -> None:
        self.total = max(1, total)
        self.fixed = fixed
        self._workers = workers

    def held(self, w: Worker) -> int:
        """Threads of the batch ``w`` computes now (0: idle)."""
        return w.outstanding[0].threads if w.outstanding else 0

    def grant(self, w: Worker, estimate_ms: float) -> int:
        """Threads for a batch of ``estimate_ms`` about to be sent to ``w``."""
        if self.fixed:
            return self.fixed
        if estimate_ms < PARALLEL_MS:
            return 1
        others = sum(self.held(o) for o in self._workers() if o is not w)
        return max(1, self.total - others)
