"""What work costs in a worker group: each model and method's measured compute per forward
row, and what follows from it: the queue's order (cheapest first), how far requests merge,
into how many pieces an expensive request is split (``ATTRSERVE_SPLIT_MS``), and whether a
batch computes on more than one thread (``service.pool.cores``)."""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Iterable

from service.core.settings import Settings
from service.core.work import Reply, Work
from service.pool.records import Pending

#: how much waiting counts against a batch's estimated compute in the queue's order: a 100 ms
#: piece goes before fresh 1 ms work once it has waited about 10 s (nothing starves)
AGING = 0.01
#: estimated compute (ms) from which a batch may compute on more than one thread: below it,
#: tensors are too small for torch to split and waking a thread team costs more than it saves
PARALLEL_MS = 2.0
#: estimated compute (ms) from which a batch always gets the free cores, untried on one thread:
#: its tensors are big enough for torch to split, and a one-thread trial would compute a whole
#: such batch at a fraction of the speed (ViT-B/16 integrated gradients of one image, 6 s:
#: with the trial, ``benchmarks.hf_image --size base`` served 0.73x the images/s of a Captum
#: loop on this 2-core machine, 0.93x with the threads fixed at 2)
HEAVY_MS = 250.0
#: more threads are kept for a model and method while they measure at least this much faster
#: per row than one thread (else one thread: its ops are too small to split, or too many)
PARALLEL_GAIN = 0.9
#: one in this many big batches runs on the thread count not chosen, to measure it again
RETRY = 16
#: the comparison takes the median of each side's last this many rates: a batch that
#: stalled while the server process took a core must not flip the choice
SAMPLES = 8


class Costs:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        #: compute per unit of cost (ms per forward row) by model and method
        self.rates: dict[tuple[str, str], float] = {}
        #: the last rates of batches over PARALLEL_MS only, on one thread (False) and on more
        #: (True), by model and method
        self.by_threads: dict[tuple[str, str], dict[bool, deque[float]]] = {}
        self._big: dict[tuple[str, str], int] = {}

    def rate(self, work: Work) -> float | None:
        return self.rates.get((work.model_id, work.name))

    def learn(self, pending: Pending, replies: list[Reply]) -> None:
        """The batch's model and method's compute per unit of cost, a moving average."""
        done = [r for r in replies if r.error is None and r.compute_ms > 0]
        if not done or pending.cost <= 0 or not pending.entries:
            return
        work = pending.entries[0].work
        rate = max(r.compute_ms for r in done) / pending.cost  # merged: one shared call
        self.rates[work.model_id, work.name] = _average(self.rate(work), rate)
        if pending.timed:
            sides = self.by_threads.setdefault((work.model_id, work.name), {})
            sides.setdefault(pending.threads > 1, deque(maxlen=SAMPLES)).append(rate)

    def parallel(self, pending: Pending) -> bool:
        """Whether ``pending`` may compute on more than one thread: it is big enough
        (``PARALLEL_MS``), and more threads measured faster per row on its model and method's
        big batches (the medians of their last ``SAMPLES``). Untried, more threads are tried
        first, then one, then the faster kept; every ``RETRY``-th big batch runs the other way,
        so the choice follows the load. A heavy batch (``HEAVY_MS``) always may."""
        if not pending.timed or not pending.entries:
            return False
        if self.estimate(pending) >= HEAVY_MS:
            return True
        work = pending.entries[0].work
        key = (work.model_id, work.name)
        sides = self.by_threads.get(key, {})
        if True not in sides or False not in sides:
            return True not in sides
        self._big[key] = self._big.get(key, 0) + 1
        many, one = (statistics.median(sides[s]) for s in (True, False))
        faster = many < PARALLEL_GAIN * one
        return not faster if self._big[key] % RETRY == 0 else faster

    def timed(self, pending: Pending) -> bool:
        """Whether the batch is big enough for more threads (``PARALLEL_MS``); its time then
        teaches the one-thread / more-threads comparison."""
        return self.estimate(pending) >= PARALLEL_MS

    def estimate(self, pending: Pending) -> float:
        """A batch's compute in ms, as its model's recent rate says (0: not known yet)."""
        if not pending.entries:
            return 0.0
        return pending.cost * (self.rate(pending.entries[0].work) or 0.0)

    def beyond_piece(self, pending: Pending) -> bool:
        """More than a piece of work: it goes to an idle worker only."""
        limit = self.settings.split_ms
        return pending.piece or (limit > 0 and self.estimate(pending) > limit)

    def fits(self, cost: int, work: Work) -> bool:
        """Whether a merged batch of ``cost`` (like ``job``) is within bounds: the cost cap, and
        about one piece of compute (``split_ms``), so merging does not undo the split."""
        if cost > self.settings.batch_max_cost:
            return False
        rate, limit = self.rate(work), self.settings.split_ms
        return not limit or rate is None or cost * rate <= limit

    def piece_rows(self, work: Work) -> int | None:
        """Examples per piece when ``job`` is worth splitting (about ``split_ms`` each, once
        its compute rate is known); None: it goes whole."""
        rate, limit = self.rate(work), self.settings.split_ms
        # only work with a merge key is split: its examples are computed each alone (verified
        # attributions and generation have none)
        if not limit or rate is None or work.key is None or work.n < 2:
            return None
        per_example = rate * work.cost / work.n
        rows = max(1, int(limit / max(per_example, 1e-9)))
        return rows if rows < work.n else None

    def next(self, waiting: Iterable[Pending]) -> Pending | None:
        """The batch to send next: the cheapest (its estimated compute, less ``AGING`` times
        the time it has waited, so expensive work is never starved), ready for a worker; with
        ``split_ms`` 0, the oldest."""
        ready = (p for p in waiting if p.closed)
        if not self.settings.split_ms:
            return next(ready, None)
        now = time.monotonic()
        return min(
            ready, key=lambda p: self.estimate(p) - AGING * 1e3 * (now - p.queued_at), default=None
        )


def _average(old: float | None, new: float) -> float:
    """A moving average of a rate (the first measurement as it is)."""
    return new if old is None else 0.7 * old + 0.3 * new
