"""Scale-out on Ray (``service.cli.ray``): the app on Ray Serve, a file job on Ray Data.

A local Ray instance (3 logical CPUs; no dashboard, a small object store) is started once for
the module and shut down after it. ``attribute --ray`` spreads its chunks over an actor per
free CPU (first, while every CPU is free), two replicas of the app answer through Ray Serve's
HTTP proxy exactly as a plain ``attrserve serve`` does (they then hold two CPUs, and Ray Data
gets one actor), and ``attribute --ray`` writes the file the local command writes.
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.service.conftest import Server, free_port

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'attrserve[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (attrserve[ray])")

from service.cli import offline  # noqa: E402
from service.cli import ray as ray_cli  # noqa: E402
from service.cli.main import build_parser  # noqa: E402
from service.core.settings import Settings  # noqa: E402

#: Ray warns about its own internals (deprecations between its modules): not ours to fix
pytestmark = [
    pytest.mark.processes,  # Ray's processes
    pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.*"),
    pytest.mark.filterwarnings("ignore::FutureWarning:ray.*"),
]

REPO = Path(__file__).resolve().parents[2]
#: response fields that differ between two answers to the same request
VOLATILE = {"timing_ms", "request_id"}

IG = {
    "method": "integrated_gradients",
    "inputs": [
        [1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0],
        [0.0, 0.1, 0.2, -0.3, 0.4, 0.5, -0.6, 0.7],
    ],
    "target": "high",
    "return_convergence_delta": True,
}
TEXT = {
    "method": "integrated_gradients",
    "inputs": ["the plot was great", "an awful film"],
    "target": "positive",
}
REFUSED = {"method": "integrated_gradients", "inputs": [[1.0, 2.0]], "target": 0}


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(
        address="local",  # a new cluster, even where one is left running on this machine
        num_cpus=3,
        include_dashboard=False,
        object_store_memory=128 << 20,
        log_to_driver=False,
        logging_level=logging.WARNING,
    )
    try:
        yield
    finally:
        ray.shutdown()


#: what the replicas serve: the two built-in models the tests ask (each model is a worker
#: process in each replica: the whole demo registry made ten)
RAY_MODELS = """
[[models]]
id = "tabular-mlp"
source = "builtin:tabular-mlp"

[[models]]
id = "text-classifier"
source = "builtin:text-classifier"
"""


@pytest.fixture(scope="module")
def ray_url(local_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two replicas of the app (two built-in models) behind Ray Serve's HTTP proxy."""
    models = tmp_path_factory.mktemp("ray") / "models.toml"
    models.write_text(RAY_MODELS)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        settings = Settings(torch_threads=1, models=str(models))
        app = ray_cli.application(settings, replicas=2)
        serve.run(app, name=ray_cli.APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def _same(a: Any, b: Any) -> None:
    assert a.keys() == b.keys()
    for k in a.keys() - VOLATILE:
        assert a[k] == b[k], k


def _post(url: str, model: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/models/{model}/attributions", json=body, timeout=60, **kw)


def test_ray_data_spreads_the_chunks_over_its_actors(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each free CPU gets an actor, started at once, and the chunks spread over them (a pool
    growing from one actor let the first, already loaded, take every block). First in the
    module: no Serve replica holds a CPU yet."""
    x = np.random.default_rng(0).normal(size=(24, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    argv = ["attribute", "--inputs", str(tmp_path / "x.npy"), "--model", "tabular-mlp",
            "--target", "1", "--method", "integrated_gradients", "--batch-size", "2",
            "--ray", "--output", str(tmp_path / "b.npz")]  # fmt: skip
    assert ray_cli.attribute(build_parser().parse_args(argv)) == 0
    err = capsys.readouterr().err
    found = re.search(r"\((\d+) chunks on (\d+) of (\d+) Ray Data actors\)", err)
    assert found is not None, err[-2000:]
    chunks, used, started = map(int, found.groups())
    assert chunks == 12 and started == 3 and used >= 2, err[-2000:]


def test_two_replicas_each_with_its_worker(ray_url: str) -> None:
    (app,) = serve.status().applications.values()
    assert app.status == "RUNNING"
    replicas = app.deployments[ray_cli.APP_NAME].replica_states
    assert replicas == {"RUNNING": 2}
    # Ray's proxy spreads requests over both replicas, each with its own worker processes (one
    # per model's group)
    seen: set[frozenset[int]] = set()
    for _ in range(40):
        body = httpx.get(ray_url + "/v1/health/ready", timeout=10).json()
        assert body["ready"] is True
        seen.add(frozenset(w["pid"] for w in body["workers"]))
        if len(seen) == 2:
            break
    assert len(seen) == 2
    first, second = seen
    assert not first & second and len(first) == len(body["models"])


@pytest.mark.parametrize(("model", "body"), [("tabular-mlp", IG), ("text-classifier", TEXT)])
def test_answers_equal_a_plain_server(
    ray_url: str, server: Server, model: str, body: dict[str, Any]
) -> None:
    via_ray = _post(ray_url, model, body)
    plain = _post(server.url, model, body)
    assert via_ray.status_code == plain.status_code == 200, via_ray.text
    _same(via_ray.json(), plain.json())


def test_errors_and_middleware_as_a_plain_server(ray_url: str, server: Server) -> None:
    # AttrServe.__call__ and its middleware run in the replica: problem+json, the caller's
    # request id (sent once: Ray's proxy adds it, the replica leaves it out), the body limit
    via_ray = _post(ray_url, "tabular-mlp", REFUSED, headers={"x-request-id": "ray-test-1"})
    plain = _post(server.url, "tabular-mlp", REFUSED, headers={"x-request-id": "ray-test-1"})
    assert via_ray.status_code == plain.status_code == 422
    assert via_ray.headers["content-type"] == "application/problem+json"
    assert via_ray.headers.get_list("x-request-id") == ["ray-test-1"]
    _same(via_ray.json(), plain.json())
    huge = httpx.post(
        f"{ray_url}/v1/models/tabular-mlp/attributions",
        content=b"[" * (17 << 20),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert huge.status_code == 413
    assert len(huge.headers.get_list("x-request-id")) == 1


def _jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def _attribute_argv(inputs: Path, *extra: str) -> list[str]:
    return ["attribute", "--inputs", str(inputs), "-q", *extra]


@pytest.mark.parametrize("kind", ["tabular", "text"])
def test_ray_data_equals_the_local_command(local_ray: None, tmp_path: Path, kind: str) -> None:
    if kind == "tabular":
        x = np.random.default_rng(0).normal(size=(13, 8)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        argv = _attribute_argv(tmp_path / "x.npy", "--model", "tabular-mlp", "--target", "1")
    else:  # raw texts: ragged tokens and per-token scores, per-example targets
        texts = ["the plot was great", "an awful film", "great", "a wonderful awful plot"]
        lines = [
            {"inputs": t, "target": ["negative", "positive"][i % 2]} for i, t in enumerate(texts)
        ]
        argv = _attribute_argv(_jsonl(tmp_path / "x.jsonl", lines), "--model", "text-classifier")
    argv += ["--method", "integrated_gradients", "--batch-size", "3"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each Ray Data actor computes: the same float sums
    try:
        local = build_parser().parse_args([*argv, "--output", str(tmp_path / "a.npz")])
        assert offline.main(local) == 0
    finally:
        torch.set_num_threads(threads)
    args = build_parser().parse_args([*argv, "--ray", "--output", str(tmp_path / "b.npz")])
    assert ray_cli.attribute(args) == 0
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert {"attributions", "outputs", "target"} <= set(a.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert not (tmp_path / "b.npz.partial").exists()


def test_ray_data_refusals_are_reported_like_the_local_command(
    local_ray: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def run(targets: tuple[int, ...]) -> int:
        lines = [{"inputs": [0.0] * 8, "target": t} for t in targets]
        argv = _attribute_argv(_jsonl(tmp_path / "x.jsonl", lines), "--model", "tabular-mlp")
        argv += ["--method", "saliency", "--batch-size", "2", "--ray"]
        return ray_cli.attribute(build_parser().parse_args([*argv, "--output", str(out)]))

    out = tmp_path / "b.npz"
    # the first chunk is checked on the driver, before Ray is asked for anything
    assert run((9, 0, 1, 2)) == 2
    assert "target" in capsys.readouterr().err
    # a later chunk is refused in an actor: reported as data, the finished chunk kept
    assert run((0, 1, 2, 9)) == 2
    err = capsys.readouterr().err
    assert "examples 2..3" in err and "1 finished chunks are kept" in err
    assert not out.exists() and (tmp_path / "b.npz.partial").is_dir()


def test_deployment_options() -> None:
    s = Settings()
    fixed = ray_cli.deployment_options(s, replicas=3, gpus_per_replica=1)
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert fixed["max_ongoing_requests"] == s.queue_size  # room for our merging
    auto = ray_cli.deployment_options(s, min_replicas=1, max_replicas=4)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"]["min_replicas"] == 1
    assert auto["autoscaling_config"]["max_replicas"] == 4


def test_kuberay_manifest() -> None:
    """deploy/rayservice.yaml (untested on a cluster; no KubeRay CRD schema package exists):
    its serveConfigV2 is a valid Ray Serve config, and its import path builds the app."""
    import yaml  # Ray's own dependency
    from ray.serve import Application
    from ray.serve.schema import ServeDeploySchema

    text = (REPO / "deploy" / "rayservice.yaml").read_text()
    assert "untested" in text.lower()
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayService")
    cluster = doc["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    assert all(g["template"]["spec"]["containers"] for g in cluster["workerGroupSpecs"])
    config = ServeDeploySchema.model_validate(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    (app,) = config.applications
    module, _, name = app.import_path.partition(":")
    builder = getattr(importlib.import_module(module), name)
    assert builder is ray_cli.app_builder
    assert isinstance(builder(app.args), Application)
