"""The same request twice gives the same bits (CONTRACT 9.1), on a server that chooses its
own thread counts (``service.pool.cores``: a batch may compute on one thread or on every core,
tried both ways and then the faster) with two workers, sync or as a job cut in chunks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.service.conftest import Server, serve_in_thread, stop_server

#: worker processes: the server's own thread counts, per worker process
pytestmark = pytest.mark.processes

ROWS = np.random.default_rng(3).normal(size=(6, 8)).round(3).tolist()
BODY: dict[str, Any] = {
    "method": "integrated_gradients",
    "inputs": ROWS,
    "target": 1,
    "seed": 11,
    "metrics": {"infidelity": {}, "sensitivity_max": {}},
}


@pytest.fixture(scope="module")
def own_threads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Two workers, the server's own thread rule (None), jobs cut in chunks of cost 64."""
    toml = '[[models]]\nid = "tabular-mlp"\nsource = "builtin:tabular-mlp"\n'
    s = serve_in_thread(
        tmp_path_factory.mktemp("threads"),
        toml=toml,
        workers=2,
        torch_threads=None,
        worker_mode="process",
        job_chunk_cost=64,
    )
    yield s
    stop_server(s)


def _answer(server: Server) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/v1/models/tabular-mlp/attributions", json=BODY, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    return {"attributions": body["attributions"], "metrics": body["metrics"]}


def test_the_same_request_gives_the_same_bits(own_threads: Server) -> None:
    """Sent again and again (the pool tries more threads, then one, then keeps the faster),
    every answer is the first one to the bit: infidelity moved in the fifth digit when the
    second request computed on another thread count."""
    first = _answer(own_threads)
    for _ in range(5):
        assert _answer(own_threads) == first


def test_a_job_cut_in_chunks_gives_the_same_bits(own_threads: Server) -> None:
    """A job (without metrics: a job refuses them) cut in chunks of cost 64 (three examples
    of 17 rows each), answered as the synchronous request is, to the bit."""
    rows = np.random.default_rng(4).normal(size=(12, 8)).round(3).tolist()
    body = {
        "method": "integrated_gradients",
        "inputs": rows,
        "target": [i % 3 for i in range(12)],
        "params": {"n_steps": 16},
        "return_convergence_delta": True,
    }
    r = httpx.post(f"{own_threads.url}/v1/models/tabular-mlp/attributions", json=body)
    assert r.status_code == 200, r.text
    want = r.json()
    r = httpx.post(f"{own_threads.url}/v1/models/tabular-mlp/attribution-jobs", json=body)
    assert r.status_code == 202, r.text
    url = f"{own_threads.url}/v1/jobs/{r.json()['id']}"
    deadline = time.monotonic() + 60
    while (job := httpx.get(url).json())["status"] not in ("succeeded", "failed", "cancelled"):
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["status"] == "succeeded", job
    got = httpx.get(f"{url}/result").json()
    assert got["attributions"] == want["attributions"]
    assert got["convergence_delta"] == want["convergence_delta"]
