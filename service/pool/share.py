"""Jobs beside synchronous requests: recent worker time by kind, and whether jobs are owed
their share of it (``ATTRSERVE_JOB_SHARE``), which ``Group`` reads to send job chunks while
synchronous requests wait, or to preempt the chunks running."""

from __future__ import annotations

import time

#: the half-life of the worker time remembered, in seconds
HALF_LIFE_S = 10.0


class WorkerTime:
    """Worker time spent on synchronous work and on job chunks (``background``), decaying."""

    def __init__(self, share: float) -> None:
        self.share = share
        self.busy = {False: 0.0, True: 0.0}
        self.at = time.monotonic()

    def account(self, background: bool, seconds: float) -> None:
        now = time.monotonic()
        decay = 0.5 ** ((now - self.at) / HALF_LIFE_S)
        self.at = now
        for kind in self.busy:
            self.busy[kind] *= decay
        self.busy[background] += seconds

    def owed(self) -> bool:
        """Whether jobs got less than their share of recent worker time."""
        total = self.busy[True] + self.busy[False]
        return self.share > 0 and (total == 0 or self.busy[True] < self.share * total)
