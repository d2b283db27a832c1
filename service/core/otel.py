"""OpenTelemetry spans for requests: the optional extra ``attrserve[otel]``, imported only when the
``OTEL_*`` variables ask for traces (``service.core.tracing``).

The SDK reads its own variables: the OTLP exporter its endpoint, headers, timeout and
compression, the tracer provider ``OTEL_TRACES_SAMPLER`` and the span limits, the batch processor
``OTEL_BSP_*``, the resource ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``. Only the
exporters are looked up here, by the names in ``OTEL_TRACES_EXPORTER``, through the entry points
the exporter packages register (as the SDK's own auto-configuration does), with one difference:
``otlp`` means OTLP over HTTP/protobuf (the OpenTelemetry specification's default, and the
exporter the extra installs) unless ``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`` says ``grpc``.

The provider is the server's own, not the process-global one, so an embedding application's
tracing is left alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from service.core.version import __version__

log = logging.getLogger("attrserve.tracing")

#: ``OTEL_TRACES_EXPORTER``'s ``otlp`` by protocol: the exporters' entry-point names
OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


class Spans:
    """Server spans continuing the caller's trace, and their children recorded after the fact."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("attrserve", __version__)

    def server(
        self, parent: tuple[str, str, int] | None, method: str
    ) -> tuple[Any, str, str, bool]:
        """Start a request's server span under ``parent`` (trace id, span id, flags: the caller's
        ``traceparent``; None for a new trace): (span, trace id, span id, sampled)."""
        context = None
        if parent is not None:
            trace_id, span_id, flags = parent
            remote = SpanContext(
                int(trace_id, 16),
                int(span_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(flags & TraceFlags.SAMPLED),
            )
            context = trace.set_span_in_context(NonRecordingSpan(remote))
        span = self.tracer.start_span(method, context, kind=SpanKind.SERVER)
        ctx = span.get_span_context()
        return span, f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}", ctx.trace_flags.sampled

    def end_server(self, span: Any, name: str, status: int, attributes: dict[str, Any]) -> None:
        if not span.is_recording():
            return
        span.update_name(name)
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        span.set_attribute("http.response.status_code", status)
        if status >= 500:  # a server span's 4xx is the caller's error, not ours
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def child(
        self, span: Any, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any]
    ) -> None:
        if not span.is_recording():
            return
        context = trace.set_span_in_context(span)
        child = self.tracer.start_span(name, context, attributes=attributes, start_time=start_ns)
        child.end(end_time=max(start_ns, end_ns))


def from_environ(environ: Mapping[str, str]) -> Spans | None:
    """Spans to the exporters ``OTEL_TRACES_EXPORTER`` names (``otlp`` when it is unset), or None
    (with a warning) when none of them can be found."""
    exporters = [e for e in map(exporter, names(environ)) if e is not None]
    if not exporters:
        return None
    provider = TracerProvider(resource=resource())
    for e in exporters:
        provider.add_span_processor(BatchSpanProcessor(e))
    return Spans(provider)


def names(environ: Mapping[str, str]) -> list[str]:
    """The traces exporters' entry-point names."""
    given = [n.strip() for n in environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")]
    protocol = next((environ[p].strip() for p in PROTOCOLS if environ.get(p, "").strip()), None)
    out = []
    for name in given:
        if name == "otlp":
            name = OTLP_BY_PROTOCOL.get(protocol or "http/protobuf", "")
            if not name:
                log.warning("attrserve: OTLP protocol %r is not supported; no spans", protocol)
        if name and name != "none":
            out.append(name)
    return out


def exporter(name: str) -> SpanExporter | None:
    """The exporter registered under ``name`` (configured by its own variables), or None."""
    found = entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        log.warning(
            "attrserve: no OpenTelemetry traces exporter %r is installed (the OTLP/HTTP one "
            "comes with pip install 'attrserve[otel]'); it sends no spans",
            name,
        )
        return None
    made: SpanExporter = next(iter(found)).load()()
    return made


def resource() -> Resource:
    """The SDK's resource from the environment, named attrserve unless it says otherwise."""
    base = Resource.create()
    ours: dict[str, str] = {}
    if str(base.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        ours[SERVICE_NAME] = "attrserve"
    if SERVICE_VERSION not in base.attributes:
        ours[SERVICE_VERSION] = __version__
    return base.merge(Resource(ours))
