"""W3C Trace Context (https://www.w3.org/TR/trace-context/) on every request: an incoming
``traceparent`` is continued, the ``traceresponse`` header names the trace and our part in it, and,
with the optional extra ``attrserve[otel]``, spans go to the exporter the standard ``OTEL_*``
variables name (``service.core.otel``, imported only then).

Spans are on when the environment asks for traces: ``OTEL_TRACES_EXPORTER`` names an exporter other
than ``none``, or, with it unset, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (OTLP then); ``OTEL_SDK_DISABLED=true`` turns them
off. The SDK's absence, or an exporter it cannot find, is a warning at start, never a failure:
tracing must not stop a server that serves fine without it.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any, NamedTuple, Protocol

from service.core.work import Reply

log = logging.getLogger("attrserve.tracing")

#: version 00 only, lowercase hex as the spec writes it; anything else starts a new trace
TRACEPARENT = re.compile(
    r"00-(?P<trace>[0-9a-f]{32})-(?P<parent>[0-9a-f]{16})-(?P<flags>[0-9a-f]{2})"
)
#: the trace flags version 00 defines (``traceresponse`` sets no other bit)
SAMPLED, RANDOM = 0x01, 0x02
#: the variables that ask for traces (the rule in the module docstring)
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class Parent(NamedTuple):
    """A valid incoming ``traceparent``: the caller's trace, its span, its flags."""

    trace_id: str
    span_id: str
    flags: int


def parse(values: Sequence[str]) -> Parent | None:
    """The request's ``traceparent`` header values as a parent, or None: absent, repeated, or
    not a version 00 value with a trace id and a parent id that are not all zeros."""
    if len(values) != 1:
        return None
    match = TRACEPARENT.fullmatch(values[0].strip(" \t"))
    if match is None or not int(match["trace"], 16) or not int(match["parent"], 16):
        return None
    return Parent(match["trace"], match["parent"], int(match["flags"], 16))


def new_id(n_bytes: int) -> str:
    """A random id of ``n_bytes`` in lowercase hex, never all zeros (the spec forbids it)."""
    while True:
        value = os.urandom(n_bytes)
        if any(value):
            return value.hex()


class Spans(Protocol):
    """What tracing asks of the span recorder (``service.core.otel.Spans``)."""

    def server(
        self, parent: tuple[str, str, int] | None, method: str
    ) -> tuple[Any, str, str, bool]:
        """Start the request's server span under ``parent`` (a ``Parent``; None: a new trace):
        (span, trace id, span id, sampled)."""
        ...

    def end_server(self, span: Any, name: str, status: int, attributes: dict[str, Any]) -> None:
        """Name, label and end the server span."""
        ...

    def child(
        self, span: Any, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]
    ) -> None:
        """Record a finished child of ``span`` with explicit times (ns since the epoch)."""
        ...


@dataclass
class Trace:
    """The current request's place in its trace."""

    trace_id: str
    #: ours: the child-id of ``traceresponse``, the parent of what we record
    span_id: str
    flags: int
    #: the server span and its recorder, when spans are on
    span: Any = None
    spans: Spans | None = None
    #: one instant on both clocks, to place ``time.perf_counter()`` readings on the epoch
    perf: float = field(default_factory=time.perf_counter)
    epoch_ns: int = field(default_factory=time.time_ns)

    @property
    def response(self) -> str:
        """The ``traceresponse`` header's value."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"

    def ns(self, perf: float) -> int:
        """A ``time.perf_counter()`` reading as ns since the epoch."""
        return self.epoch_ns + round((perf - self.perf) * 1e9)


#: the current request's trace (set by ``service.http.middleware.RequestContext``)
current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)


class Tracing:
    """The app's tracing: traces continued or started always, spans when ``spans`` is given."""

    def __init__(self, spans: Spans | None = None) -> None:
        self.spans = spans

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Tracing:
        """Spans if the ``OTEL_*`` variables ask for traces and the SDK is installed. Nothing
        of OpenTelemetry is imported unless they ask."""
        if not requested(environ):
            return cls()
        if find_spec("opentelemetry.sdk") is None:
            log.warning(
                "attrserve: the OTEL_* variables ask for traces but the OpenTelemetry SDK is not "
                "installed (pip install 'attrserve[otel]'); no spans are sent"
            )
            return cls()
        from service.core import otel  # the optional extra: imported only when asked for

        return cls(otel.from_environ(environ))

    def start(self, traceparent: Sequence[str], method: str) -> Trace:
        """The request's trace: the caller's continued, or a new one."""
        parent = parse(traceparent)
        if self.spans is not None:
            span, trace_id, span_id, sampled = self.spans.server(parent, method)
            random = parent.flags & RANDOM if parent is not None else 0
            flags = random | (SAMPLED if sampled else 0)
            return Trace(trace_id, span_id, flags, span, self.spans)
        if parent is None:  # ids of our own making are random: say so
            return Trace(new_id(16), new_id(8), RANDOM)
        # nothing is recorded out of band here, so not "sampled" (the spec's meaning of the bit)
        return Trace(parent.trace_id, new_id(8), parent.flags & RANDOM)

    def finish(
        self, trace: Trace, route: str | None, status: int, attributes: dict[str, Any]
    ) -> None:
        """End the request's server span (when spans are on), named for its method and route
        (``route``: the path template, None where there is none, as for a 404)."""
        if trace.spans is None:
            return
        method = attributes.get("http.request.method", "")
        if route:
            attributes = {**attributes, "http.route": route}
        name = f"{method} {route}" if route else method
        trace.spans.end_server(trace.span, name, status, attributes)


def record_work(submitted: float, dispatched: float, reply: Reply) -> None:
    """The current request's queue wait, batching and compute as children of its server span,
    from the times the service measured (``time.perf_counter()``): ``submitted`` to the pool,
    ``dispatched`` to a worker, the engine's ``reply.compute_ms``, placed to end now, as the
    reply reached this process."""
    trace = current.get()
    spans = trace.spans if trace is not None else None
    if trace is None or spans is None:
        return
    received = time.perf_counter()
    computing = max(submitted, received - reply.compute_ms / 1e3)
    dispatched = min(max(submitted, dispatched or computing), computing)
    spans.child(trace.span, "attrserve.queue", trace.ns(submitted), trace.ns(dispatched), {})
    spans.child(
        trace.span,
        "attrserve.batching",
        trace.ns(dispatched),
        trace.ns(computing),
        {"attrserve.batch.requests": reply.merged},
    )
    if reply.compute_ms:
        spans.child(trace.span, "attrserve.compute", trace.ns(computing), trace.ns(received), {})


def requested(environ: Mapping[str, str]) -> bool:
    """Whether the ``OTEL_*`` variables ask for traces (the rule in the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if names:
        return any(n.strip() not in ("", "none") for n in names.split(","))
    return any(environ.get(v, "").strip() for v in OTLP_ENDPOINTS)
