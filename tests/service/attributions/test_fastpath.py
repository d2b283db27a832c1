"""The attribution fast path answers exactly as the FastAPI route does, errors and metrics too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import ApiKey, Settings

X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]
ATTR = "/v1/models/tabular-mlp/attributions"
JSON = {"content-type": "application/json"}
SETTINGS = Settings(
    max_body_bytes=20_000,
    max_n_steps=500,
    api_keys=(ApiKey(key="k", models=("tabular-mlp", "image-cnn")),),
)
KEY = {"x-api-key": "k"}


def _client(fast: bool) -> TestClient:
    app = create_app(SETTINGS, start_workers=False)
    if not fast:  # the reference: every request through FastAPI's route
        app.fast_path = None
    return TestClient(app)


@pytest.fixture(scope="module")
def clients() -> Iterator[tuple[TestClient, TestClient]]:
    with _client(True) as fast, _client(False) as slow:
        yield fast, slow


def body(**extra: Any) -> bytes:
    return json.dumps(
        {"method": "integrated_gradients", "inputs": X, "target": 0, **extra}
    ).encode()


CASES: list[tuple[str, bytes, dict[str, str]]] = [
    (ATTR, body(), {**JSON, **KEY}),  # valid: 503, no workers
    (ATTR, body(), {"content-type": "application/json; charset=utf-8", **KEY}),
    (ATTR, body(), JSON),  # no key: 401
    ("/v1/models/text-classifier/attributions", body(), {**JSON, **KEY}),  # 403
    ("/v1/models/nope/attributions", body(), {**JSON, **KEY}),
    (ATTR, body(method="integrated_gradient"), {**JSON, **KEY}),
    (ATTR, body(params={"n_steps": 501}), {**JSON, **KEY}),
    (ATTR, body(inputs=[[1.0, 2.0]]), {**JSON, **KEY}),
    (ATTR, body(inputs=[[None] * 8]), {**JSON, **KEY}),
    (ATTR, body(target="nope"), {**JSON, **KEY}),
    (ATTR, body(unknown=1), {**JSON, **KEY}),
    (ATTR, body(deadline_ms=-1), {**JSON, **KEY}),
    (ATTR, body(output_encoding="hex"), {**JSON, **KEY}),
    (ATTR, b'{"method": "saliency", "inputs": [[NaN, 0, 0, 0, 0, 0, 0, 0]]}', {**JSON, **KEY}),
    (ATTR, b"{not json", {**JSON, **KEY}),
    (ATTR, b"[1, 2]", {**JSON, **KEY}),
    (ATTR, b"", {**JSON, **KEY}),
    (ATTR, body(), {"content-type": "text/plain", **KEY}),
    (ATTR, body(), KEY),
    (ATTR, body(inputs=[[0.5] * 8] * 2000), {**JSON, **KEY}),  # over the body limit: 413
    (ATTR, body(), {**JSON, **KEY, "x-deadline-ms": "250"}),
    (ATTR, body(), {**JSON, **KEY, "x-deadline-ms": "0"}),
    (ATTR, body(), {**JSON, **KEY, "x-deadline-ms": "soon"}),
    (ATTR + "/", body(), {**JSON, **KEY}),
]


@pytest.mark.parametrize(("path", "content", "headers"), CASES)
def test_same_answer(
    clients: tuple[TestClient, TestClient], path: str, content: bytes, headers: dict[str, str]
) -> None:
    headers = {**headers, "x-request-id": "same-id"}
    fast, slow = (c.post(path, content=content, headers=headers) for c in clients)
    assert fast.status_code == slow.status_code
    assert fast.headers.get("content-type") == slow.headers.get("content-type")
    assert fast.headers.get("www-authenticate") == slow.headers.get("www-authenticate")
    assert fast.content == slow.content


def test_same_metrics(clients: tuple[TestClient, TestClient]) -> None:
    def counted(c: TestClient) -> list[str]:
        text = c.get("/metrics").text
        return sorted(line for line in text.splitlines() if line.startswith("attrserve_requests_t"))

    fast, slow = clients
    assert counted(fast) == counted(slow)
    assert any('status="503"' in line for line in counted(fast))


def test_same_internal_error() -> None:
    def broken(job: object) -> None:
        raise RuntimeError("boom")

    answers = []
    headers = {**JSON, **KEY, "x-request-id": "r-1"}
    for fast in (True, False):
        client = _client(fast)
        client.app.state.attrserve.pool.submit = broken  # type: ignore[attr-defined]
        with client:  # logged with its traceback, answered as a problem: nothing escapes
            answers.append(client.post(ATTR, content=body(), headers=headers))
    fast_r, slow_r = answers
    assert fast_r.status_code == slow_r.status_code == 500
    assert fast_r.content == slow_r.content
    problem = fast_r.json()
    assert problem["request_id"] == "r-1" and "boom" not in fast_r.text
    assert problem["detail"] == "internal error (request id r-1)"
    assert fast_r.headers["content-type"] == slow_r.headers["content-type"]
