"""Remote models' predictor health, as their requests' answers show it (``GET /v1/models/{id}``
reads it): the worker calls the predictor, the group sees every answer."""

from __future__ import annotations

import time
from typing import Any

from model_registry.spec import ModelSpec
from service.core.work import Reply

#: the error codes of a predictor in trouble (``service.core.errors.Upstream*``)
UPSTREAM_CODES = frozenset({"upstream_error", "upstream_timeout"})


class Predictors:
    """For each remote model of a group: failures in a row, the last success and failure."""

    def __init__(self, specs: list[ModelSpec]) -> None:
        self.remote = {s.id for s in specs if s.remote is not None}
        self.seen: dict[str, dict[str, Any]] = {}

    def note(self, model_id: str, reply: Reply) -> None:
        if model_id not in self.remote:
            return
        seen = self.seen.setdefault(model_id, {"failures_in_a_row": 0})
        code = None if reply.error is None else reply.error.get("code")
        if code in UPSTREAM_CODES:
            seen["failures_in_a_row"] += 1
            seen["last_error"] = str((reply.error or {}).get("detail", code))
            seen["last_error_at"] = time.time()
        elif reply.error is None:
            seen["failures_in_a_row"] = 0
            seen["last_ok_at"] = time.time()

    def get(self, model_id: str) -> dict[str, Any] | None:
        return self.seen.get(model_id)
