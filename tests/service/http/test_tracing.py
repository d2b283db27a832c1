"""W3C Trace Context and the ``otel`` extra's spans (``service.core.tracing``): the parser and the
``OTEL_*`` rule alone; the middleware in process with the SDK's in-memory exporter; real servers,
one plain and one sending OTLP/HTTP to a receiver in this process, whose spans must carry the
caller's trace and the queue, batching and compute times the response reports."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from service.core import otel, tracing
from service.core.work import Reply
from service.http.middleware import RequestContext
from service.http.routing import RouteTable
from tests.service.conftest import REPO, Server, free_port, start_server, stop_server

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
CHEAP = {"method": "saliency", "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]], "target": 0}
ATTRIBUTE = "/v1/models/tabular-mlp/attributions"
CHILDREN = ("attrserve.queue", "attrserve.batching", "attrserve.compute")


def response_parts(r: httpx.Response) -> list[str]:
    """``traceresponse`` split, after checking its form (version 00, lowercase hex)."""
    value = r.headers["traceresponse"]
    assert tracing.TRACEPARENT.fullmatch(value), value
    parts = value.split("-")
    assert int(parts[2], 16), "child-id all zeros"
    return parts


# -- the parser and the rule --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([f"00-{TRACE}-{PARENT}-01"], tracing.Parent(TRACE, PARENT, 1)),
        ([f"00-{TRACE}-{PARENT}-00"], tracing.Parent(TRACE, PARENT, 0)),
        ([f" 00-{TRACE}-{PARENT}-03\t"], tracing.Parent(TRACE, PARENT, 3)),  # OWS around
        ([], None),
        ([f"00-{TRACE}-{PARENT}-01"] * 2, None),  # repeated
        ([f"00-{TRACE.upper()}-{PARENT}-01"], None),  # uppercase hex
        ([f"01-{TRACE}-{PARENT}-01"], None),  # a version we do not know
        ([f"ff-{TRACE}-{PARENT}-01"], None),
        ([f"00-{'0' * 32}-{PARENT}-01"], None),  # all-zero trace id
        ([f"00-{TRACE}-{'0' * 16}-01"], None),  # all-zero parent id
        ([f"00-{TRACE[:-1]}-{PARENT}-01"], None),
        ([f"00-{TRACE}-{PARENT}x-01"], None),
        ([f"00-{TRACE}-{PARENT}-1"], None),
        ([f"00-{TRACE}-{PARENT}-01-extra"], None),
        ([f"00_{TRACE}_{PARENT}_01"], None),
        (["garbage"], None),
    ],
)
def test_traceparent_is_parsed_strictly(values: list[str], expected: tracing.Parent | None) -> None:
    assert tracing.parse(values) == expected


@pytest.mark.parametrize(
    ("environ", "asked"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # a name alone sends nothing anywhere
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console, none"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
)
def test_which_variables_ask_for_spans(environ: dict[str, str], asked: bool) -> None:
    assert tracing.requested(environ) is asked


def test_exporter_names_follow_the_protocol() -> None:
    assert otel.names({}) == ["otlp_proto_http"]  # the extra's exporter, the spec's default
    assert otel.names({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == ["otlp_proto_grpc"]
    assert otel.names(
        {"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}
    ) == ["otlp_proto_grpc", "console"]
    assert otel.names({"OTEL_TRACES_EXPORTER": "none"}) == []


def test_a_missing_exporter_is_a_warning_not_a_failure(caplog: pytest.LogCaptureFixture) -> None:
    traces = tracing.Tracing.from_environ({"OTEL_TRACES_EXPORTER": "no_such_exporter"})
    assert traces.spans is None
    assert "no_such_exporter" in caplog.text
    trace = traces.start([f"00-{TRACE}-{PARENT}-01"], "GET")
    assert trace.trace_id == TRACE  # the trace is still continued


@pytest.mark.processes
def test_no_sdk_is_imported_unless_asked() -> None:
    """Neither the SDK nor an exporter nor our ``otel`` module (FastAPI itself imports the
    OpenTelemetry *API* when it is installed, and leaves it idle)."""
    code = (
        "import sys\n"
        "from service.http.middleware import RequestContext\n"
        "RequestContext(None, access=False)\n"
        "heavy = ('opentelemetry.sdk', 'opentelemetry.exporter', 'service.core.otel')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    for extra in ({}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SERVICE_NAME": "attrserve"}):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env={**env, **extra},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "[]", (extra, out.stdout, out.stderr)


# -- the middleware in process, spans to memory -------------------------------------------------
def in_memory() -> tuple[tracing.Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()  # the default sampler: the caller's decision, else always on
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracing.Tracing(otel.Spans(provider)), exporter


#: what the fake route reports, as the pool would: queued 4 ms, batched, computed 3 ms, merged
QUEUED_S, COMPUTE_MS, MERGED = 0.004, 3.0, 2


async def fake_route(scope: Scope, receive: Receive, send: Send) -> None:
    """A route that queued, waited and computed, answering the status its path ends with."""
    submitted = time.perf_counter()
    await asyncio.sleep(0.012)
    tracing.record_work(
        submitted, submitted + QUEUED_S, Reply(work_id=1, compute_ms=COMPUTE_MS, merged=MERGED)
    )
    status = int(scope["path"].rsplit("/", 1)[-1]) if scope["path"][-1].isdigit() else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


#: the one route the fake app has, as the app's route table finds it (the span's name)
FAKE_ROUTES = RouteTable(
    [Route("/v1/models/{model_id}/attributions", fake_route, methods=["POST"])]
)


def call(app: RequestContext, path: str, headers: dict[str, str]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return await c.post(path, headers=headers)

    return asyncio.run(go())


def times(span: ReadableSpan) -> tuple[int, int]:
    """A finished span's start and end (ns since the epoch)."""
    assert span.start_time is not None and span.end_time is not None
    return span.start_time, span.end_time


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    assert len({s.name for s in spans}) == len(spans), [s.name for s in spans]
    return {s.name: s for s in spans}


def test_server_span_continues_the_trace_with_its_children() -> None:
    traces, exporter = in_memory()
    app = RequestContext(fake_route, access=False, traces=traces, routes=FAKE_ROUTES)
    r = call(app, "/v1/models/m-1/attributions", {"traceparent": f"00-{TRACE}-{PARENT}-01"})
    _, trace_id, child_id, flags = response_parts(r)
    assert (trace_id, flags) == (TRACE, "01") and r.headers["x-request-id"] == TRACE

    spans = by_name(exporter.get_finished_spans())
    server = spans.pop("POST /v1/models/{model_id}/attributions")
    assert server.kind is SpanKind.SERVER
    assert f"{server.context.trace_id:032x}" == TRACE
    assert f"{server.context.span_id:016x}" == child_id
    assert server.parent is not None and server.parent.is_remote
    assert f"{server.parent.span_id:016x}" == PARENT
    attrs = server.attributes or {}
    assert attrs["http.response.status_code"] == 200
    assert attrs["http.route"] == "/v1/models/{model_id}/attributions"
    assert attrs["url.path"] == "/v1/models/m-1/attributions"
    assert attrs["attrserve.request_id"] == TRACE

    assert sorted(spans) == sorted(CHILDREN)
    start, end = times(server)
    for child in spans.values():
        assert child.parent is not None and child.parent.span_id == server.context.span_id
        assert child.context.trace_id == server.context.trace_id
        assert start <= times(child)[0] <= times(child)[1] <= end
    queue, batching, compute = (times(spans[n]) for n in CHILDREN)
    assert queue[1] == batching[0] and batching[1] == compute[0]
    assert abs(queue[1] - queue[0] - QUEUED_S * 1e9) < 1e3
    assert abs(compute[1] - compute[0] - COMPUTE_MS * 1e6) < 1e3
    batched = spans["attrserve.batching"].attributes or {}
    assert batched["attrserve.batch.requests"] == MERGED


def test_caller_not_sampling_means_no_spans_and_flags_say_so() -> None:
    traces, exporter = in_memory()
    app = RequestContext(fake_route, access=False, traces=traces, routes=FAKE_ROUTES)
    r = call(app, "/v1/models/m/attributions", {"traceparent": f"00-{TRACE}-{PARENT}-00"})
    assert response_parts(r)[1:4:2] == [TRACE, "00"]
    assert exporter.get_finished_spans() == ()


def test_new_trace_is_a_root_span_and_5xx_is_an_error() -> None:
    traces, exporter = in_memory()
    app = RequestContext(fake_route, access=False, traces=traces, routes=FAKE_ROUTES)
    r = call(app, "/v1/models/m/attributions/503", {"traceparent": f"00-{'0' * 32}-{PARENT}-01"})
    _, trace_id, child_id, flags = response_parts(r)
    assert trace_id != "0" * 32 and flags == "01" and r.headers["x-request-id"] == trace_id
    server = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert server.parent is None and f"{server.context.span_id:016x}" == child_id
    assert not server.status.is_ok and (server.attributes or {})["http.response.status_code"] == 503


def test_without_spans_the_trace_is_still_continued() -> None:
    app = RequestContext(fake_route, access=False, traces=tracing.Tracing(), routes=FAKE_ROUTES)
    r = call(app, "/v1/models/m/attributions", {"traceparent": f"00-{TRACE}-{PARENT}-03"})
    _, trace_id, child_id, flags = response_parts(r)
    # nothing was recorded: the sampled bit is clear; the caller's random-id bit is kept
    assert (trace_id, flags) == (TRACE, "02") and child_id != PARENT
    r = call(app, "/v1/models/m/attributions", {})
    _, trace_id, _, flags = response_parts(r)
    assert trace_id != TRACE and flags == "02" and r.headers["x-request-id"] == trace_id


# -- a real server without spans: headers and the access log ------------------------------------
def access_lines(server: Server, request_id: str, n: int) -> list[dict[str, Any]]:
    """The server's first ``n`` JSON access-log lines of ``request_id`` (a line is written once
    the response is sent, so it may come a moment after the client has its answer)."""
    end = time.monotonic() + 10
    while True:
        text = server.log.read_text().splitlines()
        lines = [json.loads(x[x.find("{") :]) for x in text if '"http_method"' in x]
        found = [x for x in lines if x["request_id"] == request_id]
        if len(found) >= n or time.monotonic() > end:
            return found
        time.sleep(0.05)


def test_traceparent_is_continued(server: Server) -> None:
    with server.client() as c:
        r = c.post(ATTRIBUTE, json=CHEAP, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    assert r.status_code == 200, r.text
    _, trace_id, child_id, _ = response_parts(r)
    assert trace_id == TRACE and child_id != PARENT
    assert r.headers["x-request-id"] == TRACE  # the request id is the trace id
    access = [x for x in access_lines(server, TRACE, 1) if x["path"] == ATTRIBUTE]
    assert access and access[-1]["trace_id"] == TRACE


def test_caller_request_id_wins_and_the_trace_goes_on(server: Server) -> None:
    headers = {"traceparent": f"00-{TRACE}-{PARENT}-01", "x-request-id": "order-77"}
    with server.client() as c:
        r = c.post(ATTRIBUTE, json=CHEAP, headers=headers)
        missing = c.get("/v1/models/no-such-model", headers=headers)  # a problem too
    for resp in (r, missing):
        assert resp.headers["x-request-id"] == "order-77"
        assert response_parts(resp)[1] == TRACE
    assert missing.status_code == 404 and missing.json()["request_id"] == "order-77"
    access = access_lines(server, "order-77", 2)
    assert len(access) == 2 and all(x["trace_id"] == TRACE for x in access)


@pytest.mark.parametrize(
    "bad",
    [f"00-{'0' * 32}-{PARENT}-01", f"00-{TRACE}-{'0' * 16}-01", f"01-{TRACE}-{PARENT}-01", "x"],
)
def test_invalid_traceparent_starts_a_new_trace(server: Server, bad: str) -> None:
    with server.client() as c:
        r = c.post(ATTRIBUTE, json=CHEAP, headers={"traceparent": bad})
        health = c.get("/v1/health/live", headers={"traceparent": bad})
    assert r.status_code == 200 and health.status_code == 200  # never an error
    for resp in (r, health):
        trace_id = response_parts(resp)[1]
        assert trace_id != TRACE and resp.headers["x-request-id"] == trace_id
    assert response_parts(r)[1] != response_parts(health)[1]


# -- a real server with the extra, sending OTLP/HTTP --------------------------------------------
class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces endpoint (protobuf) that keeps what it is sent."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", free_port()), ReceiverHandler)
        self.spans: list[tuple[dict[str, Any], Any]] = []  # (resource attributes, span)
        self.lock = threading.Lock()

    def of_trace(self, trace_id: str, n: int, timeout: float = 20) -> dict[str, Any]:
        """The trace's first ``n`` spans by name, with their resource's attributes."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                found = [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_id]
            if len(found) >= n:
                return {s.name: (r, s) for r, s in found}
            time.sleep(0.05)
        raise AssertionError(f"{len(found)} spans of trace {trace_id} arrived, not {n}")


class ReceiverHandler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            for rs in request.resource_spans:
                res = {a.key: a.value.string_value for a in rs.resource.attributes}
                self.server.spans.extend((res, s) for ss in rs.scope_spans for s in ss.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        status = 200 if self.path == "/v1/traces" else 404
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.serve_forever, daemon=True)
    thread.start()
    yield r
    r.shutdown()
    r.server_close()


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[Server]:
    """A server whose OTEL_* variables send spans to ``receiver`` (exported every 50 ms)."""
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith("OTEL_")]:
            mp.delenv(name)
        mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.server_port}")
        mp.setenv("OTEL_SERVICE_NAME", "attrserve-test")
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        s = start_server(tmp_path_factory.mktemp("traced"), workers=1)
    yield s
    stop_server(s)


def test_otlp_spans_continue_the_trace_with_queue_batching_compute(
    traced: Server, receiver: Receiver
) -> None:
    with traced.client() as c:
        r = c.post(ATTRIBUTE, json=CHEAP, headers={"traceparent": f"00-{TRACE}-{PARENT}-01"})
    assert r.status_code == 200, r.text
    _, trace_id, child_id, flags = response_parts(r)
    assert (trace_id, flags) == (TRACE, "01")

    spans = receiver.of_trace(TRACE, 1 + len(CHILDREN))
    resource, server = spans.pop("POST /v1/models/{model_id}/attributions")
    assert resource["service.name"] == "attrserve-test"
    assert server.kind == server.SPAN_KIND_SERVER
    assert server.span_id.hex() == child_id and server.parent_span_id.hex() == PARENT
    attrs = {a.key: a.value for a in server.attributes}
    assert attrs["http.response.status_code"].int_value == 200
    assert attrs["attrserve.model"].string_value == "tabular-mlp"
    assert attrs["attrserve.method"].string_value == "saliency"

    assert sorted(spans) == sorted(CHILDREN)
    children = [spans[n][1] for n in CHILDREN]
    for child in children:
        assert child.parent_span_id == server.span_id
        start, end = child.start_time_unix_nano, child.end_time_unix_nano
        assert server.start_time_unix_nano <= start <= end <= server.end_time_unix_nano
    queue, batching, compute = children
    assert queue.end_time_unix_nano == batching.start_time_unix_nano
    assert batching.end_time_unix_nano == compute.start_time_unix_nano
    # the compute span is the engine time the response reports (timing_ms, rounded to 1 µs)
    compute_ms = (compute.end_time_unix_nano - compute.start_time_unix_nano) / 1e6
    assert compute_ms == pytest.approx(r.json()["timing_ms"]["compute"], abs=2e-3)
    assert compute_ms > 0
    merged = {a.key: a.value.int_value for a in batching.attributes}
    assert merged["attrserve.batch.requests"] == 1


def test_otlp_new_trace_when_no_traceparent(traced: Server, receiver: Receiver) -> None:
    with traced.client() as c:
        r = c.get("/v1/models")
    _, trace_id, child_id, flags = response_parts(r)
    assert flags == "01" and r.headers["x-request-id"] == trace_id  # always on, by default
    (name, (_, server)), *_ = receiver.of_trace(trace_id, 1).items()
    assert name == "GET /v1/models" and server.parent_span_id == b""
    assert server.span_id.hex() == child_id


def test_receiver_is_not_fooled(receiver: Receiver) -> None:
    """The receiver's wait fails when nothing came: the span checks above can fail."""
    with pytest.raises(AssertionError, match="0 spans"):
        receiver.of_trace("f" * 32, 1, timeout=0.2)
