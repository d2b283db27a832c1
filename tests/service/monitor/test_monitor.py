"""Attribution drift monitors (CONTRACT §9.6): a reference profile, the live window of what the
model serves (concurrent requests, KServe's explain), nDCG per label equal to scikit-learn's
``ndcg_score``, a violation when the drivers change, the gauge, a restart that keeps it all,
and refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sklearn.metrics import ndcg_score

from tests.service.conftest import Server, serve_in_thread, stop_server

RNG = np.random.default_rng(5)
ROWS = RNG.normal(size=(200, 8)).round(3)
IG = {"method": "integrated_gradients", "params": {"n_steps": 8}}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("monitor")


@pytest.fixture(scope="module")
def served(data: Path) -> Iterator[Server]:
    s = serve_in_thread(data, workers=1)
    yield s
    stop_server(s)


def attribute(server: Server, rows: np.ndarray) -> dict[str, Any]:
    body = {"inputs": rows.tolist(), "target": "predicted", **IG}
    r = httpx.post(f"{server.url}/v1/models/tabular-mlp/attributions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def monitor(server: Server) -> dict[str, Any]:  # the GET
    r = httpx.get(f"{server.url}/v1/models/tabular-mlp/monitor", timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_monitor_follows_what_the_model_serves(served: Server) -> None:
    want = attribute(served, ROWS[:100])  # the reference: each label's mean |attribution|
    body = {"reference": {"inputs": ROWS[:100].tolist(), **IG, "target": "predicted"},
            "window": 500, "min_examples": 50}  # fmt: skip
    r = httpx.put(f"{served.url}/v1/models/tabular-mlp/monitor", json=body, timeout=60)
    assert r.status_code == 200, r.text
    state = r.json()
    assert state["status"] == "warming_up" and state["examples"] == 0
    labels = ["low", "mid", "high"]
    attrs = np.array(want["attributions"])
    for label, ref in state["reference"].items():
        rows = attrs[[i for i, t in enumerate(want["target"]) if labels[t] == label]]
        np.testing.assert_allclose(ref["values"], np.abs(rows).mean(axis=0), rtol=1e-5)
    # 80 requests of one row, 8 at a time, and KServe's explain: every example joins
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: attribute(served, ROWS[100 + i : 101 + i]), range(80)))
    kserve = {"instances": ROWS[180:190].tolist(), "parameters": {**IG, "target": "predicted"}}
    r = httpx.post(f"{served.url}/v1/models/tabular-mlp:explain", json=kserve, timeout=60)
    assert r.status_code == 200, r.text
    asked = {"inputs": ROWS[190:200].tolist(), "explain_if": "class != `0`", **IG}
    r = httpx.post(f"{served.url}/v1/models/tabular-mlp/predictions", json=asked, timeout=60)
    assert r.status_code == 200, r.text
    explained = r.json()["explained"]  # the explained ones join, the others do not
    assert 0 < explained < 10
    state = monitor(served)
    assert state["examples"] == state["seen"] == 90 + explained
    assert state["status"] == "ok", state["ndcg"]
    for label, score in state["ndcg"].items():
        ref, live = state["reference"][label]["values"], state["live"][label]["values"]
        assert score == pytest.approx(ndcg_score([ref], [live]), abs=1e-12)
        assert score >= 0.9
    metrics = httpx.get(f"{served.url}/metrics", timeout=30).text
    assert 'attrserve_attribution_ndcg{label="high",model="tabular-mlp"}' in metrics


def test_new_drivers_are_a_violation(served: Server) -> None:
    """Rows whose deciding features (0 and 3) sit at the baseline: their attributions vanish
    and the others lead; once they fill the window, nDCG falls under 0.9."""
    drifted = RNG.normal(size=(500, 8)).round(3)
    drifted[:, [0, 3]] = 0.0
    for start in range(0, 500, 100):
        attribute(served, drifted[start : start + 100])
    state = monitor(served)
    assert state["examples"] == 500
    assert state["status"] == "violation", state["ndcg"]
    assert min(state["ndcg"].values()) < 0.9


def test_a_restarted_server_keeps_the_monitor(tmp_path: Path) -> None:
    """Stopped (the monitor written at shutdown) and started again on the same directory: the
    same reference, window and nDCG."""
    first = serve_in_thread(tmp_path, workers=1)
    try:
        body = {"reference": {"inputs": ROWS[:50].tolist(), **IG}, "window": 40}
        r = httpx.put(f"{first.url}/v1/models/tabular-mlp/monitor", json=body, timeout=60)
        assert r.status_code == 200, r.text
        attribute(first, ROWS[50:110])  # 60 examples: the window keeps the last 40
        before = monitor(first)
    finally:
        stop_server(first)
    again = serve_in_thread(tmp_path, workers=1)
    try:
        after = monitor(again)
    finally:
        stop_server(again)
    assert before["examples"] == after["examples"] == 40 and after["seen"] == 60
    assert after["reference"] == before["reference"] and after["live"] == before["live"]
    assert after["ndcg"] == before["ndcg"]


def test_refusals(served: Server) -> None:
    url = f"{served.url}/v1/models"
    assert httpx.get(f"{url}/image-cnn/monitor", timeout=30).status_code == 404
    assert httpx.get(f"{url}/no-such/monitor", timeout=30).status_code == 404
    job = httpx.post(f"{url}/image-cnn/attribution-jobs", timeout=30,
                     json={"method": "saliency", "inputs": np.zeros((1, 3, 32, 32)).tolist(),
                           "target": 0}).json()  # fmt: skip
    for _ in range(200):
        if (
            httpx.get(f"{served.url}/v1/jobs/{job['id']}", timeout=30).json()["status"]
            == "succeeded"
        ):
            break
        time.sleep(0.05)
    r = httpx.put(f"{url}/tabular-mlp/monitor", json={"reference": {"job": job["id"]}}, timeout=30)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "reference", "job"]
    assert "image-cnn" in r.json()["detail"]
    r = httpx.put(f"{url}/tabular-mlp/monitor", timeout=30,
                  json={"reference": {"inputs": ROWS[:2].tolist()}, "window": 5,
                        "min_examples": 10})  # fmt: skip
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "min_examples"]
    text = httpx.put(f"{url}/text-classifier/monitor", timeout=30,
                     json={"reference": {"inputs": ["a fine film"]}})  # fmt: skip
    assert text.status_code == 422 and text.json()["errors"][0]["loc"] == ["path", "model_id"]
    gone = httpx.delete(f"{url}/tabular-mlp/monitor", timeout=30)
    assert gone.status_code == 200 and gone.json()["model_id"] == "tabular-mlp"
    assert httpx.get(f"{url}/tabular-mlp/monitor", timeout=30).status_code == 404
