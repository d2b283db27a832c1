"""Models served elsewhere (``remote:`` sources), explained through a real KServe predictor
(``tests.service.remote.predictor``, a ``kserve.ModelServer`` in a subprocess) by a real
attrserve server: answers equal the same method on the same model hosted locally, over V1, V2
and a plain HTTP template; gradient methods are refused by name; the predictor's failures
(500s, a wrong shape, slowness, being down) come back as 502/504 naming the model, retried
where a retry can help, behind a circuit breaker; credentials reach the predictor and never
the log."""

from __future__ import annotations

import contextlib
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
import torch

import methods
from model_registry.builtin.text import WordTokenizer
from tests.service.conftest import REPO, Server, free_port, start_server, stop_server
from tests.service.remote.predictor import cnn, forest, mlp, text

pytestmark = pytest.mark.processes  # a KServe predictor and a server in subprocesses, killed

pytest.importorskip("kserve", reason="kserve is a dev dependency")

TOKEN = "s3cret-token-for-the-predictor"
BREAKER = "retries = 1\nbreaker_failures = 2\nbreaker_cooldown_s = 600"
DOWN = "retries = 1\ntimeout_s = 2"
TABULAR = (
    'inputs = [{ name = "x", dtype = "float32", shape = ["N", 8] }]\n'
    'labels = ["low", "mid", "high"]'
)
CNN = (
    'inputs = [{ name = "image", dtype = "float32", shape = ["N", 3, 32, 32] }]\n'
    'labels = ["top-left", "top-right", "bottom-left", "bottom-right"]'
)

TEXT = 'kind = "text_classification"\nsend = "text"\nlabels = ["negative", "positive"]'
PNG = f'{CNN}\nsend = "png"'


def remote(
    id_: str, protocol: str, url: str, name: str, extra: str = "", shape: str = TABULAR
) -> str:
    return f"""
[[models]]
id = "{id_}"
source = "remote:{protocol}"
url = "{url}"
model_name = "{name}"
{shape}
group = "remote"
headers = {{ Authorization = "Bearer ${{REMOTE_TOKEN}}" }}
max_batch = 16
max_concurrency = 3
{extra}
"""


@pytest.fixture(scope="module")
def predictor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp = tmp_path_factory.mktemp("predictor")
    port, auth = free_port(), tmp / "auth.log"
    proc = start_predictor(port, auth, tmp / "predictor.log")
    try:
        yield f"http://127.0.0.1:{port}", auth
    finally:
        proc.terminate()
        proc.wait(10)


#: where the predictor of ``remote-restart`` comes up only in the middle of a job
RESTART_PORT = free_port()
#: where the predictor of ``remote-killed`` dies in the middle of a call
KILLED_PORT = free_port()


def start_predictor(port: int, auth: Path, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.service.remote.predictor", str(port), str(auth)]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(log.read_text())
        try:
            if httpx.get(f"{url}/v2/models/mlp/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the predictor did not start:\n" + log.read_text())


@pytest.fixture(scope="module")
def served(
    predictor: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    url, _ = predictor
    toml = "".join(
        [
            remote("remote-v1", "kserve-v1", url, "mlp"),
            remote("remote-v2", "oip-v2", url, "mlp"),
            remote(
                "remote-http",
                "http",
                f"{url}/v1/models/mlp:predict",
                "mlp",
                'inputs_pointer = "/instances"\noutputs_pointer = "/predictions"\n'
                'request_template = { parameters = { note = "kept" } }',
            ),
            remote("remote-flaky", "kserve-v1", url, "mlp-flaky", "retries = 3"),
            remote("remote-500", "kserve-v1", url, "mlp-500", BREAKER),
            remote("remote-shape", "oip-v2", url, "mlp-shape"),
            remote("remote-slow", "kserve-v1", url, "mlp-slow", "timeout_s = 0.5\nretries = 0"),
            remote("remote-down", "kserve-v1", f"http://127.0.0.1:{free_port()}", "mlp", DOWN),
            remote("remote-cnn", "oip-v2", url, "cnn", shape=CNN),
            remote("remote-forest", "kserve-v1", url, "forest"),
            remote(
                "remote-killed",
                "kserve-v1",
                f"http://127.0.0.1:{KILLED_PORT}",
                "mlp-slow",
                "retries = 1\ntimeout_s = 20",
            ),
            remote("remote-text-v1", "kserve-v1", url, "text", shape=TEXT),
            remote("remote-text-v2", "oip-v2", url, "text", shape=TEXT),
            remote(
                "remote-text-http",
                "http",
                f"{url}/v1/models/text:predict",
                "text",
                'instance_key = "text"',
                shape=TEXT,
            ),
            remote("remote-text-mask", "kserve-v1", url, "text", 'mask = "[UNK]"', shape=TEXT),
            remote("remote-png", "kserve-v1", url, "cnn-png", shape=PNG),
            remote("remote-png-v2", "oip-v2", url, "cnn-png", 'instance_key = "b64"', shape=PNG),
            remote(
                "remote-restart",
                "kserve-v1",
                f"http://127.0.0.1:{RESTART_PORT}",
                "mlp",
                "retries = 0\ntimeout_s = 2\nbreaker_failures = 1000",
            ),
        ]
    )
    old = os.environ.get("REMOTE_TOKEN")
    os.environ["REMOTE_TOKEN"] = TOKEN
    try:
        server = start_server(tmp_path_factory.mktemp("remote"), toml=toml, workers=1)
    finally:
        if old is None:
            os.environ.pop("REMOTE_TOKEN", None)
        else:
            os.environ["REMOTE_TOKEN"] = old
    yield server
    stop_server(server)


def x() -> torch.Tensor:
    return torch.linspace(-1, 1, 40).reshape(5, 8)


def post(server: Server, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60)


CASES = [
    ("feature_ablation", {}),
    ("occlusion", {"sliding_window_shapes": [2], "strides": [2]}),
    ("shapley_value_sampling", {"n_samples": 3}),
    ("kernel_shap", {"n_samples": 40}),
]


@pytest.mark.parametrize("model", ["remote-v1", "remote-v2", "remote-http"])
@pytest.mark.parametrize(("method", "params"), CASES, ids=[c[0] for c in CASES])
def test_a_remote_model_s_attributions_equal_the_local_model_s(
    served: Server, model: str, method: str, params: dict[str, Any]
) -> None:
    body = {"method": method, "inputs": x().tolist(), "target": "mid", "params": params,
            "seed": 3}  # fmt: skip
    r = post(served, model, body)
    assert r.status_code == 200, r.text
    want = methods.attribute(mlp(), x(), method, target=1, seed=3, **params).attributions
    torch.testing.assert_close(torch.tensor(r.json()["attributions"]), want, rtol=1e-5,
                               atol=1e-5)  # fmt: skip


def test_gradient_methods_are_refused_by_name(served: Server) -> None:
    r = post(served, "remote-v1", {"method": "integrated_gradients", "inputs": x().tolist(),
                                    "target": 1})  # fmt: skip
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "method"]
    detail = r.json()["detail"]
    assert "'remote-v1'" in detail and "served remotely" in detail
    assert "offers forwards only" in detail and "mlp" in detail
    info = httpx.get(f"{served.url}/v1/models/remote-v1").json()
    assert "integrated_gradients" not in info["methods"] and "kernel_shap" in info["methods"]
    r = post(served, "remote-v1", {"method": "feature_ablation", "inputs": x().tolist(),
                                    "target": 1, "precision": "bfloat16"})  # fmt: skip
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "precision"]
    assert "its own dtype" in r.json()["detail"]
    assert not any(m.startswith(("layer_", "neuron_")) for m in info["methods"])


def test_predictions_and_explain_go_to_the_predictor(served: Server) -> None:
    r = httpx.post(f"{served.url}/v1/models/remote-v2:predict",
                   json={"instances": x().tolist()}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text
    with torch.no_grad():
        want = mlp()(x())
    torch.testing.assert_close(torch.tensor(r.json()["predictions"]), want, rtol=1e-5, atol=1e-5)
    r = httpx.post(f"{served.url}/v1/models/remote-v1:explain",
                   json={"instances": x().tolist()}, timeout=60)  # fmt: skip
    assert r.status_code == 200, r.text  # the default explanation: feature ablation


def test_credentials_reach_the_predictor_and_never_the_log(
    served: Server, predictor: tuple[str, Path]
) -> None:
    post(served, "remote-v1", {"method": "feature_ablation", "inputs": x().tolist(), "target": 0})
    sent = predictor[1].read_text().splitlines()
    assert sent and all(line == f"Bearer {TOKEN}" for line in sent)
    post(
        served, "remote-shape", {"method": "feature_ablation", "inputs": x().tolist(), "target": 0}
    )
    info = httpx.get(f"{served.url}/v1/models/remote-v1").text
    assert TOKEN not in served.log.read_text() and TOKEN not in info


def test_a_flaky_predictor_is_retried(served: Server) -> None:
    r = post(served, "remote-flaky", {"method": "feature_ablation", "inputs": x().tolist(),
                                       "target": 2})  # fmt: skip
    assert r.status_code == 200, r.text


def problem(r: httpx.Response, status: int, code: str, upstream: object = "any") -> str:
    assert r.status_code == status, r.text
    assert r.json()["type"].endswith("/" + code), r.text
    if upstream != "any":  # the predictor's own HTTP status (null: it gave none)
        assert r.json()["upstream_status"] == upstream, r.text
    detail: str = r.json()["detail"]
    return detail


def test_the_predictor_s_faults_are_the_predictor_s(served: Server) -> None:
    body = {"method": "feature_ablation", "inputs": x().tolist(), "target": 1}
    detail = problem(post(served, "remote-shape", body), 502, "upstream_error", 200)
    assert "'remote-shape'" in detail and "shape [" in detail and "expected (" in detail
    detail = problem(post(served, "remote-slow", body), 504, "upstream_timeout")
    assert "'remote-slow'" in detail and "did not answer within 0.5 s" in detail
    detail = problem(post(served, "remote-down", body), 502, "upstream_error", None)
    assert "unreachable" in detail
    assert httpx.get(f"{served.url}/v1/models/remote-down").json()["remote"]["healthy"] is False
    detail = problem(post(served, "remote-500", body), 502, "upstream_error", 500)
    assert "answered 500" in detail
    # two failed tries in a row (the call and its retry) opened the breaker: no call now
    detail = problem(post(served, "remote-500", body), 502, "upstream_error", None)
    assert "circuit breaker open" in detail
    # the other models of the worker keep serving
    assert post(served, "remote-v1", body).status_code == 200
    # and each model's details say how its predictor answers
    bad = httpx.get(f"{served.url}/v1/models/remote-500").json()["predictor"]
    assert bad["healthy"] is False and bad["failures_in_a_row"] >= 2
    assert "circuit breaker open" in bad["last_error"] and "mlp-500" in bad["predictor"]
    good = httpx.get(f"{served.url}/v1/models/remote-v1").json()["predictor"]
    assert good["healthy"] is True and good["last_ok_at"] is not None
    # CONTRACT 8.2's view of the same: the URL, healthy, the last error
    remote = httpx.get(f"{served.url}/v1/models/remote-500").json()["remote"]
    assert remote["healthy"] is False and "circuit breaker open" in remote["last_error"]
    assert remote["url"].startswith("http://")
    assert httpx.get(f"{served.url}/v1/models/remote-v1").json()["precision"] == {
        "default": "float32",
        "probe": {},
        "chosen": None,
    }


@contextlib.contextmanager
def explainer(tmp_path: Path, *flags: str, port_flag: str = "--port") -> Iterator[Server]:
    """``attrserve explain-for`` in a subprocess with ``flags`` (the port, as ``port_flag``
    spells it, and the host added), ready; stopped afterwards."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    env |= {"ATTRSERVE_WORKERS": "1", "ATTRSERVE_TORCH_THREADS": "1",
            "ATTRSERVE_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
    cmd = [sys.executable, "-m", "service.cli.main", "explain-for", *flags,
           port_flag, str(port), "--host", "127.0.0.1"]  # fmt: skip
    with (tmp_path / "explainer.log").open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        server = Server(f"http://127.0.0.1:{port}", proc, tmp_path / "explainer.log")
        try:
            server.wait_ready()
            yield server
        finally:
            stop_server(server)


def test_explain_for_is_a_kserve_explainer_of_a_remote_predictor(
    predictor: tuple[str, Path], tmp_path: Path
) -> None:
    """``attrserve explain-for`` with the flags KServe's explainer container receives: its
    ``:explain`` answers for the predictor's model with the default method it was given."""
    url, _ = predictor
    flags = ["--model_name", "mlp", "--predictor_host", url.removeprefix("http://"),
             "--protocol", "v2", "--inputs", "x:float32:N,8", "--labels", "low,mid,high",
             "--method", "shapley_value_sampling", "--params", '{"n_samples": 2}']  # fmt: skip
    with explainer(tmp_path, *flags, port_flag="--http_port") as server:
        body = {"instances": x().tolist(), "parameters": {"target": 2, "seed": 1}}
        r = httpx.post(f"{server.url}/v1/models/mlp:explain", json=body, timeout=60)
        assert r.status_code == 200, r.text
        want = methods.attribute(mlp(), x(), "shapley_value_sampling", target=2, seed=1,
                                 n_samples=2).attributions  # fmt: skip
        got = torch.tensor([e["attributions"] for e in r.json()["explanations"]])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        info = httpx.get(f"{server.url}/v1/models/mlp").json()
        assert info["methods"] and "integrated_gradients" not in info["methods"]


@pytest.mark.parametrize("protocol", ["v1", "v2"])
def test_explain_for_needs_only_the_predictor_and_the_model_name(
    predictor: tuple[str, Path], tmp_path: Path, protocol: str
) -> None:
    """The contract's flags alone (no --inputs, --labels or --method): a V2 predictor's
    inputs come from its metadata, a V1 predictor's rows are taken as they come; the answer is
    feature ablation of each example's predicted class, as the same model hosted here gives."""
    url, _ = predictor
    flags = ["--model-name", "mlp", "--predictor-host", url.removeprefix("http://"),
             "--protocol", protocol]  # fmt: skip
    with explainer(tmp_path, *flags) as server:
        r = httpx.post(f"{server.url}/v1/models/mlp:explain", json={"instances": x().tolist()},
                       timeout=60)  # fmt: skip
        assert r.status_code == 200, r.text
        predicted = mlp()(x()).argmax(1)
        want = methods.attribute(mlp(), x(), "feature_ablation", target=predicted).attributions
        got = r.json()["explanations"]
        assert [e["target"] for e in got] == predicted.tolist()
        torch.testing.assert_close(torch.tensor([e["attributions"] for e in got]), want,
                                   rtol=1e-5, atol=1e-5)  # fmt: skip
        (inp,) = httpx.get(f"{server.url}/v1/models/mlp").json()["inputs"]
        assert inp["shape"][1:] == ([8] if protocol == "v2" else [None]), inp


def test_the_kserve_explainer_manifest_runs_explain_for() -> None:
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load((REPO / "deploy" / "kserve-explainer.yaml").read_text())
    assert doc["apiVersion"] == "serving.kserve.io/v1beta1" and doc["kind"] == "InferenceService"
    (container,) = doc["spec"]["explainer"]["containers"]
    assert container["command"] == ["attrserve", "explain-for"]
    from service.cli.explain_for import models_toml
    from service.cli.main import build_parser

    args = build_parser().parse_args(["explain-for", *container["args"]])
    toml = models_toml(args)
    assert 'source = "remote:kserve-v1"' in toml and "churn-predictor.default" in toml
    assert args.http_port == container["ports"][0]["containerPort"]


def test_a_predictor_killed_in_the_middle_of_a_call_is_a_502_at_once(
    served: Server, tmp_path: Path
) -> None:
    """The connection drops while the predictor computes (SIGKILL): the call is tried again,
    finds nothing listening, and the request is a 502 naming the model and the predictor, long
    before the call's 20 s timeout; the worker serves the next request."""
    proc = start_predictor(KILLED_PORT, tmp_path / "auth.log", tmp_path / "predictor.log")
    try:
        with httpx.Client(timeout=60) as client:
            body = {"method": "feature_ablation", "inputs": x()[:1].tolist(), "target": 1}
            t0 = time.monotonic()
            pending = client.build_request(
                "POST", f"{served.url}/v1/models/remote-killed/attributions", json=body
            )
            killer = threading.Timer(0.8, proc.kill)  # within the predictor's 2 s of sleep
            killer.start()
            r = client.send(pending)
            killer.join()
            assert r.status_code == 502, r.text
            assert time.monotonic() - t0 < 15
            problem = r.json()
            assert problem["type"].endswith("/upstream_error")
            assert "remote-killed" in problem["detail"] and str(KILLED_PORT) in problem["detail"]
            ok = post(served, "remote-v1", {"method": "feature_ablation", "inputs": x().tolist(),
                                            "target": 1})  # fmt: skip
            assert ok.status_code == 200, ok.text
    finally:
        proc.kill()
        proc.wait(10)


def test_a_job_across_a_predictor_restart_loses_nothing(served: Server, tmp_path: Path) -> None:
    """The predictor is down when the job starts and comes up while it waits: its chunks are
    tried again, and the job's answer is the local model's, every example."""
    xs = torch.linspace(-2, 2, 8 * 24).reshape(24, 8)
    body = {"method": "feature_ablation", "inputs": xs.tolist(), "target": 1}
    r = httpx.post(f"{served.url}/v1/models/remote-restart/attribution-jobs", json=body)
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    time.sleep(3.0)  # its first chunks fail: nothing listens there yet
    assert httpx.get(f"{served.url}/v1/jobs/{job}").json()["status"] in ("queued", "running")
    proc = start_predictor(RESTART_PORT, tmp_path / "auth.log", tmp_path / "predictor.log")
    try:
        for _ in range(600):
            info = httpx.get(f"{served.url}/v1/jobs/{job}").json()
            if info["status"] not in ("queued", "running"):
                break
            time.sleep(0.1)
        assert info["status"] == "succeeded", info
        result = httpx.get(f"{served.url}/v1/jobs/{job}/result", timeout=60).json()
    finally:
        proc.terminate()
        proc.wait(10)
    want = methods.attribute(mlp(), xs, "feature_ablation", target=1).attributions
    torch.testing.assert_close(torch.tensor(result["attributions"]), want, rtol=1e-5, atol=1e-5)


def test_the_metrics_that_need_only_forwards_run_on_a_remote_model(served: Server) -> None:
    metrics = {"infidelity": {}, "sensitivity_max": {"n_perturb_samples": 3},
               "deletion": {"steps": 4}, "insertion": {"steps": 4}}  # fmt: skip
    body = {"method": "feature_ablation", "inputs": x().tolist(), "target": 1, "metrics": metrics}
    r = post(served, "remote-v2", body)
    assert r.status_code == 200, r.text
    attrs = methods.attribute(mlp(), x(), "feature_ablation", target=1).attributions
    want = methods.evaluate(mlp(), x(), attrs, target=1, metrics=metrics, seed=0,
                            method="feature_ablation", method_params={})  # fmt: skip
    got = r.json()["metrics"]
    for name in ("infidelity", "sensitivity_max"):
        torch.testing.assert_close(torch.tensor(got[name]), want[name].float(), rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
    for name in ("deletion", "insertion"):
        torch.testing.assert_close(torch.tensor(got[name]["curve"]), want[name]["curve"].float(),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip


def test_an_image_model_behind_a_predictor_is_occluded_as_the_local_one(served: Server) -> None:
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    params = {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}
    body = {"method": "occlusion", "inputs": images.tolist(), "target": "bottom-left",
            "params": params}  # fmt: skip
    r = post(served, "remote-cnn", body)
    assert r.status_code == 200, r.text
    want = methods.attribute(cnn(), images, "occlusion", target=2, **params).attributions
    got = torch.tensor(r.json()["attributions"])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_a_scikit_learn_model_is_explained_as_captum_explains_it(served: Server) -> None:
    """No gradient reaches a random forest: KernelSHAP and feature ablation through its KServe
    predictor equal Captum's on a forward that calls the forest itself."""
    from captum.attr import FeatureAblation, KernelShap

    model = forest()

    def forward(t: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(model.predict_proba(t.double().numpy())).float()

    body = {"method": "feature_ablation", "inputs": x().tolist(), "target": 2}
    r = post(served, "remote-forest", body)
    assert r.status_code == 200, r.text
    want = FeatureAblation(forward).attribute(x(), target=2)
    torch.testing.assert_close(torch.tensor(r.json()["attributions"]), want, rtol=1e-5, atol=1e-6)
    body = {"method": "kernel_shap", "inputs": x()[:1].tolist(), "target": 1, "seed": 0,
            "params": {"n_samples": 300}}  # fmt: skip
    r = post(served, "remote-forest", body)
    assert r.status_code == 200, r.text
    ours = torch.tensor(r.json()["attributions"])
    theirs = KernelShap(forward).attribute(x()[:1], target=1, n_samples=300)
    # two samplers: the same Shapley values within sampling error, and the same sum (efficiency)
    torch.testing.assert_close(ours.sum(), theirs.sum(), rtol=1e-4, atol=1e-5)
    assert float((ours - theirs).norm() / theirs.norm()) < 0.25


REVIEWS = ["the plot was great but the ending was awful", "A boring, dull film; I hated it!"]
TEXT_CASES = [CASES[0], CASES[2], CASES[3]]


@pytest.mark.parametrize("model", ["remote-text-v1", "remote-text-v2", "remote-text-http"])
@pytest.mark.parametrize(("method", "params"), TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_a_predictor_that_takes_text_is_explained_over_its_words(
    served: Server, model: str, method: str, params: dict[str, Any]
) -> None:
    """The predictor tokenizes texts itself; attrserve sends each perturbation as a text with
    the word dropped. Dropping a word is what the local model's padding baseline does, so the
    attributions per word equal the local model's per token (one word, one token here)."""
    body = {"method": method, "inputs": REVIEWS, "target": "positive", "params": params,
            "seed": 3}  # fmt: skip
    r = post(served, model, body)
    assert r.status_code == 200, r.text
    ids, words = WordTokenizer()(REVIEWS)
    want = methods.attribute(text(), ids, method, target=1, seed=3, baselines=0, **params)
    got = r.json()
    assert got["tokens"] == [t.split() for t in REVIEWS]
    for i, row in enumerate(words):
        ours = torch.tensor(got["attributions"][i][: len(row)])
        torch.testing.assert_close(ours, want.attributions[i, : len(row)], rtol=1e-5, atol=1e-6)


def test_the_text_sent_keeps_everything_but_the_word_replaced(served: Server) -> None:
    """``mask`` replaces an ablated word, the text around it kept: "[UNK]" is a word the
    model knows as unknown, so each attribution is the output's change when that word becomes
    an unknown one, which the local model gives with the UNK id as its baseline."""
    from model_registry.builtin.text import UNK_ID

    body = {"method": "feature_ablation", "inputs": REVIEWS[1:], "target": "negative"}
    r = post(served, "remote-text-mask", body)
    assert r.status_code == 200, r.text
    ids, _ = WordTokenizer()(REVIEWS[1:])
    want = methods.attribute(text(), ids, "feature_ablation", target=0, baselines=UNK_ID)
    torch.testing.assert_close(torch.tensor(r.json()["attributions"]), want.attributions,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
    assert r.json()["tokens"][0] == ["A", "boring,", "dull", "film;", "I", "hated", "it!"]
    info = httpx.get(f"{served.url}/v1/models/remote-text-mask").json()
    assert info["tokenizer"] is True and info["kind"] == "text_classification"


@pytest.mark.parametrize("model", ["remote-png", "remote-png-v2"])
def test_a_predictor_that_takes_encoded_images_is_occluded_as_the_local_model(
    served: Server, model: str
) -> None:
    """Each occluded image is sent as a PNG file; PNG is lossless, so pixels on the 1/255 grid
    arrive as they are and the answer equals the local model's."""
    g = torch.Generator().manual_seed(5)
    images = torch.randint(0, 256, (2, 3, 32, 32), generator=g).float() / 255
    params = {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]}
    body = {"method": "occlusion", "inputs": images.tolist(), "target": "bottom-left",
            "params": params}  # fmt: skip
    r = post(served, model, body)
    assert r.status_code == 200, r.text
    want = methods.attribute(cnn(), images, "occlusion", target=2, **params).attributions
    torch.testing.assert_close(torch.tensor(r.json()["attributions"]), want, rtol=1e-4,
                               atol=1e-5)  # fmt: skip


def test_superpixels_and_units_of_remote_models_are_the_local_ones(served: Server) -> None:
    """Regions are drawn by attrserve, not the predictor: a remote image model's superpixels
    are those of the images sent, its answer the local model's on that mask; a remote text
    model's sentences are the local text model's, and so are their attributions (dropping a
    sentence's words is what the local model's padding baseline does)."""
    from methods.engine import superpixels
    from model_registry.builtin import image

    images, _ = image.make_data(2, torch.Generator().manual_seed(3))
    spec = {"superpixels": {"algorithm": "slic", "n_segments": 10, "compactness": 5}}
    body = {"method": "feature_ablation", "inputs": images.tolist(), "target": "top-right",
            "params": {"feature_mask": spec}}  # fmt: skip
    r = post(served, "remote-cnn", body)
    assert r.status_code == 200, r.text
    segments = torch.from_numpy(superpixels.segment_batch(images.numpy(), spec["superpixels"]))
    assert torch.equal(torch.tensor(r.json()["feature_mask"]), segments)
    want = methods.attribute(cnn(), images, "feature_ablation", target=1,
                             feature_mask=segments[:, None]).attributions  # fmt: skip
    torch.testing.assert_close(torch.tensor(r.json()["attributions"]), want, rtol=1e-4,
                               atol=1e-5)  # fmt: skip
    texts = ["The plot was great. The ending was awful!", "A boring, dull film. I hated it!"]
    body = {"method": "feature_ablation", "inputs": texts, "target": "positive",
            "units": "sentence"}  # fmt: skip
    remote_answer = post(served, "remote-text-v1", body)
    assert remote_answer.status_code == 200, remote_answer.text
    got = remote_answer.json()
    tokenizer = WordTokenizer()
    ids, tokens = tokenizer(texts)
    mask = torch.zeros_like(ids)
    for i, spans in enumerate(tokenizer.offsets(texts)):
        starts = [u["start"] for u in got["units"][i]]
        for j, (a, _) in enumerate(spans):
            mask[i, j] = max(k for k, s in enumerate(starts) if s <= a)
    want = methods.attribute(text(), ids, "feature_ablation", target=1, baselines=0,
                             feature_mask=mask).attributions  # fmt: skip
    assert got["tokens"] == [["The plot was great.", "The ending was awful!"],
                             ["A boring, dull film.", "I hated it!"]]  # fmt: skip
    for i in range(2):
        first = [int((mask[i, : len(tokens[i])] == k).nonzero()[0]) for k in range(2)]
        torch.testing.assert_close(torch.tensor(got["attributions"][i]), want[i, first],
                                   rtol=1e-5, atol=1e-6)  # fmt: skip
