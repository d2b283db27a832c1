"""What every model route shares: its declared errors, its metrics and access-log labels
(``Observed``), and the wait for a client that goes away."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import Receive, Scope

from service.core.work import labels
from service.http.problems import to_service_error
from service.http.routing import route_info
from service.http.state import AppState
from service.wire.catalog import Problem

#: declared as application/problem+json with the Problem schema (service.http.openapi_doc)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": text}
    for code, text in {
        400: "malformed body",
        404: "unknown model or method",
        413: "body over the limit",
        422: "cannot be served (shape, dtype, NaN, target, method, limits)",
        429: "queue full (Retry-After)",
        503: "not ready, worker lost, or shutting down (Retry-After)",
        504: "deadline passed (the work is stopped)",
    }.items()
}


async def until_disconnect(receive: Receive) -> None:
    """Returns when the client has gone (the body is read: the next message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class Observed:
    """One model request's metrics (count by status, latency, compute) and access-log labels:
    the model, the operation (the route's name: "attributions", "tcav", ...), the method where
    the operation has one ("" where not); label values come from the catalogue and the routes
    only, never from free user text."""

    def __init__(
        self, state: AppState, scope: Scope, model_id: str, operation: str, method: str = ""
    ) -> None:
        self.tel = state.telemetry
        self.started = time.perf_counter()
        info = route_info(scope)
        known = not method or method in state.method_names or method in labels()
        self.model = info["model"] = model_id if model_id in state.specs else "_unknown"
        self.operation = info["operation"] = operation
        self.method = info["method"] = method if known else "_unknown"

    def __enter__(self) -> Observed:
        return self

    def computed(self, ms: float) -> None:
        tel = self.tel
        tel.labels(tel.compute, self.model, self.operation, self.method).observe(ms / 1e3)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        status = 200
        if isinstance(exc, Exception):
            status = to_service_error(exc).status
        elif exc is not None:
            status = 499
        tel = self.tel
        labels = (self.model, self.operation, self.method)
        tel.labels(tel.requests, *labels, str(status)).inc()
        tel.labels(tel.latency, *labels).observe(time.perf_counter() - self.started)
