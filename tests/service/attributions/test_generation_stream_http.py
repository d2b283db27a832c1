"""``Accept: text/event-stream`` on a generative model's attributions route (CONTRACT 8.3), on
the main server's "gpt2-dir": the token events and the result equal the answer without a
stream; a client that hangs up stops the work (the worker serves the next request at once);
a model that does not write answers, and pictures, are refused before any work."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import orjson
import pytest

from tests.service.conftest import Server

URL = "/v1/models/gpt2-dir/attributions"
SSE = {"Accept": "text/event-stream"}


def events(lines: Any) -> Any:
    """(event, data) pairs of a server-sent event stream, as they come."""
    name, data = None, []
    for line in lines:
        if not line:
            if name is not None:
                yield name, orjson.loads("\n".join(data))
            name, data = None, []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


@pytest.mark.parametrize(
    "body",
    [
        {"method": "feature_ablation", "inputs": {"prompt": "my friend alice lives in the city"},
         "target": None, "params": {"gen_args": {"max_new_tokens": 3}}},
        {"method": "input_x_gradient", "inputs": {"prompt": "my friend alice lives in the city"},
         "target": "paris rome"},
        {"method": "lime", "inputs": {"prompt": "my friend {} lives in {}",
                                      "features": ["alice", "the city"]},
         "target": "paris rome", "seed": 3, "params": {"n_samples": 20}},
    ],
    ids=["feature_ablation-generated", "input_x_gradient", "lime-template"],
)  # fmt: skip
def test_the_stream_equals_the_answer_without_it(server: Server, body: dict[str, Any]) -> None:
    with server.client() as c:
        whole = c.post(URL, json=body)
        assert whole.status_code == 200, whole.text
        want = whole.json()
        with c.stream("POST", URL, json=body, headers=SSE) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            got = list(events(r.iter_lines()))
    names = [n for n, _ in got]
    assert names == ["token"] * len(want["output_tokens"]) + ["result"], names
    tokens = [d for n, d in got if n == "token"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert [t["token"] for t in tokens] == want["output_tokens"]
    np.testing.assert_allclose([t["attr"] for t in tokens], want["token_attr"], rtol=1e-9)
    result = got[-1][1]
    assert result["input_tokens"] == want["input_tokens"]
    assert result["output_tokens"] == want["output_tokens"]
    for key in ("seq_attr", "token_attr"):
        np.testing.assert_allclose(result[key], want[key], rtol=1e-9, err_msg=key)
    for key, values in want["step_scores"].items():
        np.testing.assert_allclose(result["step_scores"][key], values, rtol=1e-9, err_msg=key)
    assert result["params"]["stream"] is True


def test_hanging_up_stops_the_work(server: Server) -> None:
    """Integrated gradients of 1024 steps, one row per forward, per answer token (seconds
    each): the client reads the first token and goes; the worker, not restarted, answers a
    cheap request long before the rest of the answer would have been attributed."""
    words = "my friend alice lives in the city and bob lives near the old city of rome " * 3
    body = {"method": "layer_integrated_gradients", "inputs": {"prompt": words.strip()},
            "target": "paris rome oslo lima paris rome", "internal_batch_size": 1,
            "params": {"n_steps": 1024}, "deadline_ms": 120000}  # fmt: skip
    with server.client() as c:
        (before,) = [(w["pid"], w["restarts"]) for w in c.get("/v1/health/ready").json()["workers"]
                     if w["group"] == "gpt2-dir"]  # fmt: skip
        t0 = time.monotonic()
        with c.stream("POST", URL, json=body, headers=SSE) as r:
            assert r.status_code == 200
            first = next(events(r.iter_lines()))
        per_token = time.monotonic() - t0
        assert first[0] == "token" and first[1]["index"] == 0
        cheap = {"method": "feature_ablation", "target": "paris",
                 "inputs": {"prompt": "{} lives in", "features": ["alice"]}}  # fmt: skip
        t0 = time.monotonic()
        r = c.post(URL, json=cheap)
        assert r.status_code == 200, r.text
        # the five tokens left would take ~5 x per_token; a stopped stream, one chunk
        assert time.monotonic() - t0 < max(2.0, 2 * per_token), per_token
        (after,) = [(w["pid"], w["restarts"]) for w in c.get("/v1/health/ready").json()["workers"]
                    if w["group"] == "gpt2-dir"]  # fmt: skip
        assert after == before


@pytest.mark.parametrize(
    ("model", "extra", "loc"),
    [
        ("tabular-mlp", {"method": "saliency", "inputs": [[0.0] * 8], "target": 0},
         ["header", "accept"]),
        ("gpt2-dir", {"render": {"format": "png"}}, ["body", "render"]),
        ("gpt2-dir", {"method": "occlusion"}, ["body", "method"]),
    ],
)  # fmt: skip
def test_refused_before_any_work(
    server: Server, model: str, extra: dict[str, Any], loc: list[Any]
) -> None:
    body = {"method": "feature_ablation", "inputs": {"prompt": "alice lives in"},
            "target": "paris", **extra}  # fmt: skip
    with server.client() as c:
        r = c.post(f"/v1/models/{model}/attributions", json=body, headers=SSE)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == loc
