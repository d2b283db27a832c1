"""The cores the workers share, handed out per batch as torch intra-op threads.

The rule (measured with ``benchmarks.load`` and an engine sweep, docs/operations.md "Threads
follow the work"): a batch computes on one thread unless it is big (its model and method's
measured rate says over ``PARALLEL_MS``) and more threads have measured faster per row on
that model and method's big batches (``Costs.parallel``); then it gets every core no other
worker's running batch holds, at least one. On 2 cores, image-CNN IG over 16 examples takes
219 ms on one thread and 84 ms on two; tabular IG over 2,000 examples is no faster on two
(its ops are too small to split) and would only burn the second core. So one busy group
computes on every core, and many groups with small requests compute side by side, one core
each: processes for many small requests, threads for big batches.

A batch's threads are decided when it is sent. Work of more than a piece goes only to an idle
worker, so it starts at once and the count is exact; a cheap batch in a worker's ready slot
gets one thread anyway. What a worker holds is the count of the batch it is computing (the
head of its ``outstanding``), so a lost worker or a finished batch frees its cores with no
bookkeeping of their own. ``ATTRSERVE_TORCH_THREADS`` fixes the count instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from service.pool.records import Worker


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

    def grant(self, w: Worker, *, many: bool) -> int:
        """Threads for a batch about to be sent to ``w``; ``many``: it may use more than one."""
        if self.fixed:
            return self.fixed
        if not many:
            return 1
        others = sum(self.held(o) for o in self._workers() if o is not w)
        return max(1, self.total - others)
