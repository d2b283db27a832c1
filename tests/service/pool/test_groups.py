"""Worker groups and the model repository against a real server (CONTRACT §7.8): a model that
cannot load, one whose request never stops and one that crashes its worker, each next to a
healthy model that is served as usual throughout; ``ATTRSERVE_STRICT_START``; the repository
through ``tritonclient`` (index, load of a changed, a broken and a new entry, unload with a
request in flight) behind admin keys."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.worker.threads import cpu_count
from tests.service.conftest import REPO, Server, free_port, start_server, stop_server

#: a real server: crashes, stuck requests, killed workers
pytestmark = [pytest.mark.timeout(300), pytest.mark.processes]

HEALTHY = """
[[models]]
id = "healthy"
source = "builtin:tabular-mlp"
"""
BROKEN = """
[[models]]
id = "broken"
source = "python:tests.service.factory:two_input"
inputs = [{ name = "a", dtype = "float32", shape = ["N", 3] },
          { name = "b", dtype = "float32", shape = ["N", 2] }]
output_shape = [7]
"""


def factory_model(name: str) -> str:
    """A models.toml entry for ``tests.service.factory:<name>``: [N, 2] -> labels a, b."""
    return f"""
[[models]]
id = "{name}"
source = "python:tests.service.factory:{name}"
labels = ["a", "b"]
inputs = [{{ name = "x", dtype = "float32", shape = ["N", 2] }}]
"""


FAULTY = "".join(factory_model(m) for m in ("stuck", "crashy", "slow", "threads"))
USER, ADMIN = "k-user", "k-admin"
KEYS = {"api_keys": f'[{{"key": "{USER}"}}]', "admin_keys": f'[{{"key": "{ADMIN}"}}]'}
TAB = {"method": "saliency", "inputs": [[0.1] * 8], "target": 0}
X2 = {"method": "saliency", "inputs": [[0.5, -0.5]], "target": 0}
FAULT = {"method": "saliency", "inputs": [[500.0, 0.0]], "target": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(
        tmp_path_factory.mktemp("groups"),
        toml=HEALTHY + BROKEN + FAULTY,
        every_model=False,
        worker_timeout_s=2,
        torch_threads=None,  # the cores shared batch by batch (test_threads_follow_the_work)
        **KEYS,
    )
    try:
        wait_states(s, {"healthy": "ready", "broken": "failed", "stuck": "ready"})
        wait_states(s, {"crashy": "ready", "slow": "ready", "threads": "ready"})
        yield s
    finally:
        stop_server(s)


def headers(key: str = USER) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def ready(s: Server) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(s.url + "/v1/health/ready", timeout=5).json()
    return body


def states(s: Server) -> dict[str, dict[str, Any]]:
    models: dict[str, dict[str, Any]] = ready(s)["models"]
    return models


def wait_states(s: Server, want: dict[str, str], timeout: float = 120) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while True:
        got = states(s)
        if all(got[m]["state"] == w for m, w in want.items()):
            return got
        if time.monotonic() > end:
            raise TimeoutError(f"{got} never became {want}:\n{s.log.read_text()[-3000:]}")
        time.sleep(0.2)


def attribute(s: Server, model: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    kw.setdefault("timeout", 60)
    kw.setdefault("headers", headers())
    return httpx.post(f"{s.url}/v1/models/{model}/attributions", json=body, **kw)


def healthy_is_prompt(s: Server) -> None:
    t0 = time.monotonic()
    r = attribute(s, "healthy", TAB)
    assert r.status_code == 200, r.text
    assert time.monotonic() - t0 < 2.0


# -- isolation -------------------------------------------------------------------------------


def test_a_model_that_cannot_load_fails_alone(served: Server) -> None:
    got = states(served)
    assert got["broken"]["state"] == "failed" and "output" in got["broken"]["reason"]
    assert got["broken"]["group"] == "broken"
    r = httpx.get(served.url + "/v1/health/ready")
    assert r.status_code == 200 and r.json()["status"] == "degraded"
    t0 = time.monotonic()
    body = {"method": "saliency", "inputs": [[[1, 2, 3]], [[1, 2]]], "target": 0}
    r = httpx.post(
        served.url + "/v1/models/broken/attributions", json=body, headers=headers(), timeout=30
    )
    assert time.monotonic() - t0 < 1.0  # at once, not after the deadline
    assert r.status_code == 503 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/model_unavailable")
    assert "'broken'" in r.json()["detail"] and got["broken"]["reason"] in r.json()["detail"]
    info = httpx.get(served.url + "/v1/models/broken", headers=headers()).json()
    assert info["state"] == "failed" and info["reason"] == got["broken"]["reason"]
    assert info["ready"] is False
    # a configuration mistake is one line naming the model and the field, however often its
    # worker is restarted, and no traceback
    log = served.log.read_text()
    lines = [line for line in log.splitlines() if "'broken'" in line]
    assert len(lines) == 1 and "field 'output_shape'" in lines[0], lines
    assert "Traceback" not in log
    healthy_is_prompt(served)
    assert httpx.get(served.url + "/v1/models/healthy", headers=headers()).json()["state"] == (
        "ready"
    )


def test_a_stuck_request_holds_only_its_group(served: Server) -> None:
    stuck_pid = pid_of(served, "stuck")
    answer: dict[str, httpx.Response] = {}

    def hang() -> None:
        answer["r"] = attribute(served, "stuck", {**FAULT, "deadline_ms": 1000})

    t = threading.Thread(target=hang)
    t.start()
    time.sleep(0.3)
    for _ in range(3):  # served as usual while the other group's worker is stuck
        healthy_is_prompt(served)
    t.join(30)
    assert answer["r"].status_code == 504
    # the stuck worker is replaced (cancelled work still running after worker_timeout_s), and
    # a request waiting meanwhile is served by the new one: the model is not "failed"
    later = attribute(served, "stuck", X2)
    assert later.status_code == 200, later.text
    assert pid_of(served, "stuck") != stuck_pid
    healthy_is_prompt(served)


def test_a_crash_fails_its_model_at_once_then_it_recovers(served: Server) -> None:
    r = attribute(served, "crashy", FAULT)
    assert r.status_code == 503 and "'crashy'" in r.json()["detail"], r.text
    t0 = time.monotonic()
    again = attribute(served, "crashy", X2)
    if again.status_code != 200:  # the new worker not ready yet: 503 at once, with the reason
        assert again.status_code == 503 and time.monotonic() - t0 < 1.0
        assert "crashed" in again.json()["detail"] and again.headers["retry-after"]
    healthy_is_prompt(served)
    wait_states(served, {"crashy": "ready"})
    assert attribute(served, "crashy", X2).status_code == 200


@pytest.mark.skipif(cpu_count() < 2, reason="one core: every batch computes on one thread")
def test_threads_follow_the_work(served: Server) -> None:
    """A batch of unknown cost computes on one thread; once its model's rate says it takes
    more than a couple of milliseconds, on every core no other batch holds."""
    seen = []
    for _ in range(20):
        r = attribute(served, "threads", X2)
        assert r.status_code == 200, r.text
        seen.append(int(r.json()["outputs"][0]))
        if seen[-1] == cpu_count():
            break
    assert seen[0] == 1 and seen[-1] == cpu_count(), seen
    assert attribute(served, "healthy", TAB).status_code == 200


def pid_of(s: Server, group: str) -> int:
    workers = ready(s)["workers"]
    (pid,) = [w["pid"] for w in workers if w["group"] == group and w["state"] != "failed"]
    return int(pid)


@pytest.mark.lifecycle
def test_strict_start_stops_on_a_failed_model(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text(HEALTHY + BROKEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    env |= {"ATTRSERVE_STRICT_START": "1", "ATTRSERVE_DATA_DIR": str(tmp_path / "data")}
    cmd = [sys.executable, "-m", "service.cli.main", "serve", "--port", str(free_port()),
           "--models", str(tmp_path / "models.toml")]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "'broken'" in done.stderr and "STRICT_START" in done.stderr
    # the mistake and the refusal, each once, without a traceback
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "'broken'" in line]
    assert len(lines) == 2 and all("field 'output_shape'" in line for line in lines), lines


# -- the model repository ----------------------------------------------------------------


def triton(s: Server) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(s.url.removeprefix("http://"))


def test_repository_needs_an_admin_key(served: Server) -> None:
    from tritonclient.utils import InferenceServerException

    client = triton(served)
    for key in (None, USER):
        with pytest.raises(InferenceServerException, match=r"API key|admin key"):
            client.get_model_repository_index(headers=None if key is None else headers(key))
    r = httpx.post(served.url + "/v2/repository/index", headers=headers(USER))
    assert r.status_code == 403 and "ATTRSERVE_ADMIN_KEYS" in r.json()["error"]
    # an admin key is valid on every route
    assert attribute(served, "healthy", TAB, headers=headers(ADMIN)).status_code == 200


def test_repository_index_load_and_unload(served: Server) -> None:
    from tritonclient.utils import InferenceServerException

    client, admin = triton(served), headers(ADMIN)
    index = {m["name"]: m for m in client.get_model_repository_index(headers=admin)}
    assert index["healthy"]["state"] == "READY" and index["healthy"]["version"] == "1"
    assert index["broken"]["state"] == "UNAVAILABLE" and "output" in index["broken"]["reason"]
    toml = served.log.parent / "models.toml"
    original = toml.read_text()
    try:
        # a changed entry is served without a restart
        toml.write_text(original.replace('id = "healthy"\n', 'id = "healthy"\nversion = "2"\n'))
        client.load_model("healthy", headers=admin)
        info = httpx.get(served.url + "/v1/models/healthy", headers=admin).json()
        assert info["version"] == "2" and info["state"] == "ready"
        healthy_is_prompt(served)
        # a broken entry: the load fails with the reason, version 2 serves on
        toml.write_text(
            original.replace(
                'id = "healthy"\nsource = "builtin:tabular-mlp"',
                'id = "healthy"\nversion = "3"\n' + BROKEN.split("\n", 3)[3].strip(),
            )
        )
        with pytest.raises(InferenceServerException, match="output") as failed:
            client.load_model("healthy", headers=admin)
        assert "version 2 serves on" in str(failed.value)
        assert httpx.get(served.url + "/v1/models/healthy", headers=admin).json()["version"] == "2"
        healthy_is_prompt(served)
        # a new entry
        toml.write_text(original + '\n[[models]]\nid = "added"\nsource = "builtin:tabular-mlp"\n')
        with pytest.raises(InferenceServerException, match="no model 'nowhere'"):
            client.load_model("nowhere", headers=admin)
        client.load_model("added", headers=admin)
        assert attribute(served, "added", TAB).status_code == 200
        assert client.is_model_ready("added", headers=admin)
        # unload: a request in flight finishes, later ones get 404 naming the model
        slow = {"method": "integrated_gradients", "inputs": [[0.5, -0.5]], "target": 0,
                "params": {"n_steps": 20}, "internal_batch_size": 1}  # fmt: skip
        answer: dict[str, httpx.Response] = {}
        t = threading.Thread(target=lambda: answer.update(r=attribute(served, "slow", slow)))
        t.start()
        time.sleep(0.4)
        client.unload_model("slow", headers=admin)
        t.join(30)
        assert answer["r"].status_code == 200, answer["r"].text
        r = attribute(served, "slow", X2)
        assert r.status_code == 404 and "unloaded" in r.json()["detail"]
        index = {m["name"]: m for m in client.get_model_repository_index(headers=admin)}
        assert index["slow"] == {
            "name": "slow",
            "version": "1",
            "state": "UNAVAILABLE",
            "reason": "unloaded",
        }
        info = httpx.get(served.url + "/v1/models/slow", headers=admin).json()
        assert info["state"] == "unloaded"
        end = time.monotonic() + 30  # its group, serving nothing now, stops
        while "slow" in {w["group"] for w in ready(served)["workers"]}:
            assert time.monotonic() < end
            time.sleep(0.2)
        # loaded again
        toml.write_text(original)
        client.load_model("slow", headers=admin)
        assert attribute(served, "slow", X2).status_code == 200
    finally:
        toml.write_text(original)
