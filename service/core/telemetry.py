"""Prometheus metrics, in a registry of the app's own (so several apps can coexist in tests)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class Telemetry:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "attrserve_requests",
            'Requests by model, operation (the route\'s name), method ("" where none) and '
            "HTTP status",
            ["model", "operation", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "attrserve_request_latency_seconds",
            "Request latency (whole request) by model, operation and method",
            ["model", "operation", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.compute = Histogram(
            "attrserve_compute_seconds",
            "Engine time per request (shared when merged) by model, operation and method",
            ["model", "operation", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "attrserve_queue_depth", "Requests waiting for a worker", registry=r
        )
        self.batch_size = Histogram(
            "attrserve_batch_requests",
            "Requests merged into one engine call",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.merged = Counter(
            "attrserve_merged_requests", "Requests answered by a merged engine call", registry=r
        )
        self.restarts = Counter(
            "attrserve_worker_restarts", "Worker processes restarted", registry=r
        )
        self.rejected = Counter(
            "attrserve_queue_rejections", "Requests rejected with 429 (queue full)", registry=r
        )
        self.workers_ready = Gauge(
            "attrserve_workers_ready", "Workers with their models loaded", registry=r
        )
        self.jobs = Gauge("attrserve_jobs", "Attribution jobs by status", ["status"], registry=r)
        self.job_queue = Gauge("attrserve_job_queue_depth", "Attribution jobs queued", registry=r)
        self.job_chunk = Histogram(
            "attrserve_job_chunk_seconds", "Time to run one chunk of an attribution job", registry=r
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def labels(self, metric: MetricWrapperBase, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per label set: on the request path the
        lookup cost more than the update. Only for values from a bounded set (catalogue names,
        statuses), as every label set is anyway: the cache is never pruned."""
        key = (id(metric), values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def render(self) -> bytes:
        return generate_latest(self.registry)
