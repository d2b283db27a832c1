"""Attribution drift monitors as a capability: a reference profile from a finished job or from
rows attributed now (the template runs that work), a tap on the attributions the model serves
afterwards (``AppState.taps``: the attributions route, KServe's and OIP's explain, and the
examples ``predictions`` explains), a
flusher that persists them and sets ``attrserve_attribution_ndcg{model,label}``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import Gauge

from model_registry.spec import ModelSpec
from service import kinds
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Reply, Work
from service.http.state import AppState
from service.monitor.protocol import InputsReference, MonitorRequest
from service.monitor.store import Monitor, Monitors
from service.serving.capability import Capability, Done
from service.serving.profiles import flat_rows
from service.wire.attributions import AttributionRequest

log = logging.getLogger("attrserve.monitor")
#: seconds between the flusher's rounds
FLUSH_S = 1.0
#: the operations whose answers are attributions a monitor's window takes
SERVED = frozenset({"attributions", "predictions"})


def served_rows(spec: ModelSpec, reply: Reply) -> tuple[np.ndarray, list[str], list[str]] | None:
    """A served answer's flat rows, labels and feature names; None where it has no fixed
    features (texts, lists of layers)."""
    if reply.tokens is not None or reply.layers is not None or not reply.attributions:
        return None
    parts = [np.asarray(a) for a in reply.attributions]
    body = {"attributions": parts if reply.as_tuple else parts[0], "target": reply.target,
            "params": reply.params}  # fmt: skip
    return flat_rows(spec, body)


class Reference(Capability[InputsReference]):
    """The rows of a reference given as inputs, attributed as an attributions request."""

    operation = "monitor"
    stem = "monitor"
    request = InputsReference
    response = MonitorRequest
    job_operation_id = "submitMonitorJob"

    def build(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: InputsReference,
        deadline: float,
        request_id: str,
        prepared: Any,
    ) -> Work:
        kind = kinds.of(spec)
        explanation = kind.catalogue(spec).explanation
        method = req.method or explanation.method
        params = req.params if req.method is not None else dict(explanation.params)
        target = req.target if req.target is not None else kind.catalogue(spec).target
        areq = AttributionRequest(method=method, inputs=req.inputs, target=target,
                                  params=kinds.with_defaults(spec, method, params))  # fmt: skip
        work = kind.build_work(settings, spec, areq, deadline, request_id)
        if not isinstance(work, Attribution) or work.texts:
            raise UnsupportedMethod(
                f"a monitor compares fixed features; model {spec.id!r}'s attributions are "
                "per token or not a tensor model's",
                loc=("path", "model_id"),
            )
        return work

    def answer(self, done: Done) -> dict[str, Any]:
        return {"reply": done.reply}

    async def start(self, state: AppState) -> None:
        monitors = Monitors(Path(state.settings.data_dir) / "monitors")
        await asyncio.to_thread(monitors.load, set(state.specs))
        gauge = Gauge("attrserve_attribution_ndcg",
                      "nDCG of the live attribution ranking against the monitor's reference",
                      ["model", "label"], registry=state.telemetry.registry)  # fmt: skip
        state.monitors = {"store": monitors, "gauge": gauge}

        def tap(operation: str, done: Done) -> None:
            # the attributions served: the route's, explain's, and the explained predictions'
            if operation not in SERVED or done.spec.id not in monitors.by_model:
                return
            found = served_rows(done.spec, done.reply)
            if found is not None:
                monitors.observe(done.spec.id, found[1], found[0].astype(np.float32))

        state.taps.append(tap)
        state.monitors["task"] = asyncio.create_task(self._flusher(monitors, gauge))

    async def stop(self, state: AppState) -> None:
        parts = state.monitors or {}
        task = parts.get("task")
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        store = parts.get("store")
        if store is not None:
            await asyncio.to_thread(store.flush)

    async def _flusher(self, monitors: Monitors, gauge: Gauge) -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                for monitor in await asyncio.to_thread(monitors.flush):
                    set_gauge(gauge, monitor)
            except OSError as exc:
                log.warning("attrserve: monitors not written (%s)", exc)


def set_gauge(gauge: Gauge, monitor: Monitor) -> dict[str, Any]:
    """The monitor's state, its nDCG per label exported."""
    state = monitor.state()
    for label, value in state["ndcg"].items():
        gauge.labels(model=monitor.model_id, label=label).set(value)
    return state


def check_request(req: MonitorRequest) -> int:
    """The examples before a monitor judges."""
    if req.min_examples is not None and req.min_examples > req.window:
        raise InvalidRequest(
            f"min_examples {req.min_examples} is more than the window keeps ({req.window})",
            loc=("body", "min_examples"),
        )
    return req.min_examples or min(100, req.window)


REFERENCE = Reference()
