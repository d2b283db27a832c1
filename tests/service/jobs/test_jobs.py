"""Attribution jobs end to end: a real server, real workers, SQLite on disk."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from model_registry.builtin.tabular import TabularMLP
from tests.service.conftest import Server, serve_in_thread, start_server, stop_server

A = {"X-API-Key": "k-a"}
B = {"Authorization": "Bearer k-b"}
FINISHED = ("succeeded", "failed", "cancelled")
NOISE = {"arg_min": 0, "arg_max": 4, "arg_step": 0.5}
#: float32's unit of rounding
EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(scope="module")
def jobs_server(keyed_server: Server) -> Server:
    """The session's keyed server (tests/service/conftest.py): keys k-a and k-b for every
    model, jobs in chunks of cost 256."""
    return keyed_server


def wait(
    c: httpx.Client,
    job_id: str,
    headers: dict[str, str],
    until: tuple[str, ...] = FINISHED,
    timeout: float = 60,
) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        info: dict[str, Any] = c.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if info["status"] in until:
            return info
        time.sleep(0.05)
    raise TimeoutError(info)


def submit(c: httpx.Client, model: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    r = c.post(f"/v1/models/{model}/attribution-jobs", json=body, headers=headers)
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/jobs/{r.json()['id']}"
    return str(r.json()["id"])


def test_job_equals_the_synchronous_answer(jobs_server: Server) -> None:
    x = np.random.default_rng(0).random((300, 8), dtype=np.float32)
    body = {
        "method": "integrated_gradients",
        "inputs": x.tolist(),
        "target": [i % 3 for i in range(300)],
        "params": {"n_steps": 16},
        "return_convergence_delta": True,
    }
    with jobs_server.client() as c:
        job_id = submit(c, "tabular-mlp", body, A)
        seen = []
        while (info := c.get(f"/v1/jobs/{job_id}", headers=A).json())["status"] not in FINISHED:
            seen.append(info["progress"]["done"])
            time.sleep(0.01)
        assert info["status"] == "succeeded" and info["progress"] == {"done": 300, "total": 300}
        assert seen == sorted(seen)  # progress only grows
        result = c.get(f"/v1/jobs/{job_id}/result", headers=A).json()
        want = []
        for part in range(0, 300, 100):  # the synchronous route takes at most 256 examples
            sync = {
                **body,
                "inputs": body["inputs"][part : part + 100],
                "target": body["target"][part : part + 100],
            }
            r = c.post("/v1/models/tabular-mlp/attributions", json=sync, headers=A)
            want.append(r.json())
        np.testing.assert_allclose(
            result["attributions"],
            np.concatenate([w["attributions"] for w in want]),
            rtol=1e-4,
            atol=1e-5,
        )
        assert result["target"] == body["target"]
        assert len(result["convergence_delta"]) == 300
        # the schema's timing: queued, computing, and in all (which holds the other two)
        timing = result["timing_ms"]
        assert set(timing) == {"queue", "compute", "total"}
        assert timing["queue"] >= 0 and 0 < timing["compute"] <= timing["total"]
        assert result["model_version"] and result["method"] == "integrated_gradients"
        npz = c.get(f"/v1/jobs/{job_id}/result?format=npz", headers=A)
        with np.load(io.BytesIO(npz.content)) as z:
            np.testing.assert_allclose(z["attributions"], result["attributions"], rtol=1e-6)
            assert z["outputs"].shape == (300,)
            assert z["target"].tolist() == body["target"]  # as `attrserve attribute` writes
        # a finished job: DELETE removes it and its result (CONTRACT 8.4)
        listed = [j["id"] for j in c.get("/v1/jobs", headers=A).json()["jobs"]]
        assert job_id in listed
        r = c.delete(f"/v1/jobs/{job_id}", headers=A)
        assert r.status_code == 200 and r.json()["status"] == "succeeded"
        assert c.get(f"/v1/jobs/{job_id}", headers=A).status_code == 404
        assert c.get(f"/v1/jobs/{job_id}/result", headers=A).status_code == 404
        assert job_id not in [j["id"] for j in c.get("/v1/jobs", headers=A).json()["jobs"]]


def chunks_run(c: httpx.Client) -> float:
    for line in c.get("/metrics").text.splitlines():
        if line.startswith("attrserve_job_chunk_seconds_count"):
            return float(line.split()[-1])
    return 0.0


def test_a_cheap_job_runs_in_one_chunk_once_its_cost_is_known(jobs_server: Server) -> None:
    """The first chunk is sized from the model and method's measured rate (a synchronous
    request taught it): a job that takes well under ATTRSERVE_JOB_CHUNK_MS runs whole, not in
    small chunks that each pay the engine's fixed costs again."""
    x = np.random.default_rng(1).random((240, 8), dtype=np.float32).tolist()
    body = {"method": "input_x_gradient", "inputs": x, "target": 0}
    with jobs_server.client() as c:
        for _ in range(3):  # the rate, measured
            r = c.post("/v1/models/tabular-mlp/attributions", json=body, headers=A)
            assert r.status_code == 200, r.text
        before = chunks_run(c)
        job_id = submit(c, "tabular-mlp", body, A)
        assert wait(c, job_id, A)["status"] == "succeeded"
        assert chunks_run(c) - before == 1
        result = c.get(f"/v1/jobs/{job_id}/result", headers=A).json()
        np.testing.assert_allclose(result["attributions"], r.json()["attributions"], rtol=1e-6)


def test_texts_and_errors_at_submission(jobs_server: Server) -> None:
    with jobs_server.client() as c:
        texts = ["a wonderful film", "dull", "a great and wonderful plot"] * 5
        job_id = submit(
            c,
            "text-classifier",
            {"method": "integrated_gradients", "inputs": texts, "target": "positive"},
            A,
        )
        assert wait(c, job_id, A)["status"] == "succeeded"
        result = c.get(f"/v1/jobs/{job_id}/result", headers=A).json()
        assert result["tokens"][0] == ["a", "wonderful", "film"] and len(result["tokens"]) == 15
        assert result["method"] == "layer_integrated_gradients"
        # a bad request gets its 4xx at submission, as on the synchronous route
        bad = [
            ({"method": "nope", "inputs": [[0.0] * 8], "target": 0}, 404),
            ({"method": "saliency", "inputs": [[0.0] * 7], "target": 0}, 422),
            ({"method": "saliency", "inputs": [[0.0] * 8], "target": 5}, 422),
            ({"method": "saliency", "inputs": [[0.0] * 8], "target": -1}, 422),  # CONTRACT 9.1
            ({"method": "saliency", "inputs": [[0.0] * 8], "target": 0, "render": {}}, 422),
        ]
        for body, status in bad:
            r = c.post("/v1/models/tabular-mlp/attribution-jobs", json=body, headers=A)
            assert r.status_code == status, r.text
        for route, body in [
            ("attack-jobs", {"method": "fgsm", "params": {"epsilon": 0.1}}),
            ("counterfactual-jobs", {"perturbation": "gaussian_noise", "params": NOISE}),
        ]:
            body = {**body, "inputs": [[0.0] * 8] * 2, "target": [0, -1]}
            r = c.post(f"/v1/models/tabular-mlp/{route}", json=body, headers=A)
            assert r.status_code == 422, r.text
            assert r.json()["errors"][0]["loc"] == ["body", "target", 1]
        # a job may hold more examples than a synchronous request
        r = c.post(
            "/v1/models/tabular-mlp/attributions",
            json={"method": "saliency", "inputs": [[0.0] * 8] * 300, "target": 0},
            headers=A,
        )
        assert r.status_code == 422


def test_jobs_belong_to_their_key(jobs_server: Server) -> None:
    with jobs_server.client() as c:
        job_id = submit(
            c, "tabular-mlp", {"method": "saliency", "inputs": [[1.0] * 8], "target": 0}, A
        )
        wait(c, job_id, A)
        assert c.get(f"/v1/jobs/{job_id}", headers=B).status_code == 404
        assert c.get(f"/v1/jobs/{job_id}/result", headers=B).status_code == 404
        assert c.delete(f"/v1/jobs/{job_id}", headers=B).status_code == 404
        assert c.get(f"/v1/jobs/{job_id}").status_code == 401
        mine = [j["id"] for j in c.get("/v1/jobs", headers=A).json()["jobs"]]
        theirs = [j["id"] for j in c.get("/v1/jobs", headers=B).json()["jobs"]]
        assert job_id in mine and job_id not in theirs
        # newest first, paged, filtered
        page = c.get("/v1/jobs?limit=1", headers=A).json()
        assert page["jobs"][0]["id"] == job_id and page["next_cursor"]
        rest = c.get(f"/v1/jobs?limit=100&cursor={page['next_cursor']}", headers=A).json()
        assert job_id not in [j["id"] for j in rest["jobs"]] and rest["next_cursor"] is None
        assert mine[1:] == [j["id"] for j in rest["jobs"]]
        done = c.get("/v1/jobs?status=succeeded", headers=A).json()["jobs"]
        assert all(j["status"] == "succeeded" for j in done)
        assert c.get("/v1/jobs?status=nope", headers=A).status_code == 422


def long_job(c: httpx.Client) -> str:
    """A job on the slow model (50 ms a forward) that runs for minutes unless stopped."""
    body = {
        "method": "integrated_gradients",
        "inputs": [[0.5, -0.5]] * 64,
        "target": 0,
        "params": {"n_steps": 1000},
        "internal_batch_size": 4,
    }
    job_id = submit(c, "slow", body, A)
    wait(c, job_id, A, until=("running",))
    return job_id


def test_synchronous_requests_keep_priority_and_cancel_frees_the_worker(
    jobs_server: Server,
) -> None:
    with jobs_server.client() as c:
        job_id = long_job(c)
        cancelled = False
        try:
            time.sleep(0.3)  # the chunk is computing
            sync = {"method": "saliency", "inputs": [[0.1, 0.2]], "target": 1}
            for _ in range(3):  # served between the job's internal batches, not after its chunk
                t0 = time.perf_counter()
                r = c.post("/v1/models/slow/attributions", json=sync, headers=A)
                assert r.status_code == 200, r.text
                assert time.perf_counter() - t0 < 5.0  # not after the chunk (~50 s)
            info = c.get(f"/v1/jobs/{job_id}", headers=A).json()
            assert info["status"] == "running"
            t0 = time.perf_counter()
            r = c.delete(f"/v1/jobs/{job_id}", headers=A)
            cancelled = True
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
            r = c.post(
                "/v1/models/tabular-mlp/attributions",
                json={"method": "saliency", "inputs": [[1.0] * 8], "target": 0},
                headers=A,
            )
            assert r.status_code == 200 and time.perf_counter() - t0 < 5.0
            assert c.get(f"/v1/jobs/{job_id}/result", headers=A).status_code == 409
            assert wait(c, job_id, A)["status"] == "cancelled"
            # cancelled, it stays listed; a second DELETE removes it
            assert c.delete(f"/v1/jobs/{job_id}", headers=A).json()["status"] == "cancelled"
            assert c.get(f"/v1/jobs/{job_id}", headers=A).status_code == 404
        finally:  # a failure above must not leave the long job holding the jobs that follow
            if not cancelled:
                c.delete(f"/v1/jobs/{job_id}", headers=A)


@pytest.mark.processes
@pytest.mark.lifecycle
def test_a_killed_server_finishes_the_job_after_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    settings: dict[str, Any] = {
        "workers": 1,
        "data_dir": data,
        "job_chunk_cost": 40,
        "job_ttl_s": 3,
    }
    server = start_server(tmp_path, **settings)
    body = {
        "method": "integrated_gradients",
        "inputs": [[0.3, -0.2]] * 24,
        "target": 1,
        "params": {"n_steps": 32},
    }
    try:
        with server.client() as c:
            job_id = submit(c, "slow", body, {})
            end = time.monotonic() + 60
            while (info := c.get(f"/v1/jobs/{job_id}").json())["progress"]["done"] < 3:
                assert time.monotonic() < end and info["status"] == "running", info
                time.sleep(0.02)
            before = info["progress"]["done"]
            assert before < 24
    finally:
        os.kill(server.process.pid, signal.SIGKILL)  # no shutdown, no drain
        server.process.wait(10)
    server = start_server(tmp_path, **settings)
    try:
        with server.client() as c:
            info = c.get(f"/v1/jobs/{job_id}").json()
            assert info["progress"]["done"] >= before  # resumes, not from the start
            info = wait(c, job_id, {})
            assert info["status"] == "succeeded", info
            result = c.get(f"/v1/jobs/{job_id}/result").json()
            sync = c.post("/v1/models/slow/attributions", json=body).json()
            np.testing.assert_allclose(result["attributions"], sync["attributions"], rtol=1e-5)
            # finished results expire after the TTL (3 s here)
            end = time.monotonic() + 15
            while c.get(f"/v1/jobs/{job_id}").status_code != 404:
                assert time.monotonic() < end, "the job did not expire"
                time.sleep(0.2)
            assert not (data / "jobs" / job_id).exists()
    finally:
        stop_server(server)


def test_limits(tmp_path: Path) -> None:
    server = serve_in_thread(
        tmp_path,
        workers=1,
        data_dir=tmp_path / "d",
        max_data_bytes=12_000,  # as files take on disk: a few 4 kB blocks
        max_job_body_bytes=1 << 20,
        max_body_bytes=4096,
    )
    try:
        with server.client() as c:
            small = {"method": "saliency", "inputs": [[0.0] * 8] * 4, "target": 0}
            big = {**small, "inputs": [[0.123456] * 8] * 300}  # ~21 kB: over the disk budget
            r = c.post("/v1/models/tabular-mlp/attribution-jobs", json=big)
            assert r.status_code == 507, r.text
            # the job route takes bodies over the synchronous limit (up to its own)
            assert c.post("/v1/models/tabular-mlp/attributions", json=big).status_code == 413
            huge = {**small, "inputs": [[0.123456] * 8] * 20000}
            assert c.post("/v1/models/tabular-mlp/attribution-jobs", json=huge).status_code == 413
            assert c.post("/v1/models/tabular-mlp/attribution-jobs", json=small).status_code == 202
            text = c.get("/metrics").text
            assert "attrserve_jobs{" in text and "attrserve_job_queue_depth" in text
    finally:
        stop_server(server)


def test_a_job_over_a_list_of_layers_answers_per_layer(jobs_server: Server) -> None:
    """CONTRACT §7.7 through the jobs path: chunks keep the per-layer structure."""
    x = np.random.default_rng(1).random((40, 8), dtype=np.float32)
    body = {
        "method": "layer_gradient_x_activation",
        "inputs": x.tolist(),
        "target": 1,
        "params": {"layer": ["fc1", "fc3"]},
    }
    with jobs_server.client() as c:
        job_id = submit(c, "tabular-mlp", body, A)
        assert wait(c, job_id, A)["status"] == "succeeded"
        result = c.get(f"/v1/jobs/{job_id}/result", headers=A).json()
        sync = c.post("/v1/models/tabular-mlp/attributions", json=body, headers=A).json()
        npz = c.get(f"/v1/jobs/{job_id}/result?format=npz", headers=A)
    assert len(result["attributions"]) == 2
    # float32 rounding of what is compared: each value comes of sums of at most `terms`
    # products (tabular-mlp's widest layer, forward or back), so two batchings of the
    # examples differ by at most about `terms` eps of the magnitudes summed (2.4 eps seen,
    # cutting the 40 examples anywhere). Per example that scale is its largest value, not
    # each value's own, which may cancel to near 0 (an element-wise rtol of 1e-5 failed at
    # 1.05e-5 on such a value). A misplaced example or layer is off by its whole size.
    terms = max(max(m.in_features, m.out_features) for m in TabularMLP().modules()
                if isinstance(m, torch.nn.Linear))  # fmt: skip
    for i in range(2):
        got, want = np.asarray(result["attributions"][i]), np.asarray(sync["attributions"][i])
        assert got.shape == want.shape
        scale = np.maximum(np.abs(want).max(axis=1, keepdims=True), np.finfo(np.float32).tiny)
        off = float((np.abs(got - want) / scale).max()) / EPS32
        assert off <= terms, f"layer {i}: {off:.1f} eps of an example's scale (float32: {terms})"
    assert np.asarray(result["attributions"][1]).shape == (40, 3)
    with np.load(io.BytesIO(npz.content)) as z:
        np.testing.assert_allclose(z["attributions_0"], result["attributions"][0], rtol=1e-6)


@pytest.mark.parametrize(
    ("route", "sync", "body"),
    [
        (
            "attack-jobs",
            "attacks",
            {"method": "fgsm", "params": {"epsilon": 0.4, "loss": "cross_entropy"}},
        ),
        ("counterfactual-jobs", "counterfactuals", {"perturbation": "feature_ablation"}),
    ],
)
def test_attack_and_counterfactual_jobs_equal_their_routes(
    jobs_server: Server, route: str, sync: str, body: dict[str, Any]
) -> None:
    """Per-example tensors in params (a mask, baselines) are cut with their chunk's examples."""
    rng = np.random.default_rng(1)
    x = rng.random((120, 8), dtype=np.float32) * 2 - 1
    per_example = (rng.random((120, 8)) > 0.3).astype(np.float32).tolist()
    params = dict(body["params"]) if "params" in body else {}
    if route == "attack-jobs":
        params["mask"] = per_example
    else:
        params.update(arg_min=0, arg_max=9, arg_step=1, baselines=(x[::-1] * 0.5).tolist())
    body = {**body, "inputs": x.tolist(), "params": params}
    with jobs_server.client() as c:
        before = chunks_run(c)
        r = c.post(f"/v1/models/tabular-mlp/{route}", json=body, headers=A)
        assert r.status_code == 202, r.text
        info = wait(c, r.json()["id"], A)
        assert info["status"] == "succeeded", info
        result = c.get(f"/v1/jobs/{info['id']}/result", headers=A).json()
        want = c.post(f"/v1/models/tabular-mlp/{sync}", json=body, headers=A).json()
        assert result["job_id"] == info["id"]
        np.testing.assert_allclose(result["perturbed"], want["perturbed"], rtol=1e-6)
        np.testing.assert_allclose(result["predictions"], want["predictions"], rtol=1e-5)
        for key in ("target", "predicted", "flipped", "min_param"):
            assert result.get(key) == want.get(key), key
        assert chunks_run(c) >= before + 2  # a first chunk of a few examples, then the rest
        npz = c.get(f"/v1/jobs/{info['id']}/result?format=npz", headers=A)
        with np.load(io.BytesIO(npz.content)) as z:
            np.testing.assert_allclose(z["perturbed"], want["perturbed"], rtol=1e-6)
        bad = c.post(f"/v1/models/tabular-mlp/{route}", json={**body, "render": {}}, headers=A)
        assert bad.status_code == 422 and bad.json()["errors"][0]["loc"] == ["body", "render"]


#: members of an answer that say how it was computed, not what: they differ between a
#: synchronous answer and a job's by design (the batch sizes the engine chose for a job's
#: chunks, which have other numbers of examples, are its first chunk's)
HOW = {"job_id", "timing_ms", "merged_requests", "internal_batch_size", "perturbations_per_eval"}


def assert_same_answer(got: Any, want: Any, where: str = "") -> None:
    """``got`` equals ``want`` member by member: the same keys and strings exactly, numbers
    within float32 round-off (a job's chunks batch examples differently)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert set(got) - HOW == set(want) - HOW, (where, set(got) ^ set(want))
        for key in set(want) - HOW:
            assert_same_answer(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list) and want and all(isinstance(v, (dict, str)) for v in want):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_answer(g, w, f"{where}[{i}]")
    elif isinstance(want, (list, float)) and not isinstance(want, bool):
        try:
            expected = np.asarray(want, float)
        except ValueError:  # ragged (a tuple of inputs, a list of layers, texts' tokens)
            assert isinstance(got, list) and len(got) == len(want), where
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert_same_answer(g, w, f"{where}[{i}]")
            return
        np.testing.assert_allclose(np.asarray(got, float), expected, 1e-4, 1e-5, err_msg=where)
    else:
        assert got == want, (where, got, want)


@pytest.mark.parametrize(
    ("model", "route", "body"),
    [
        ("tabular-mlp", "attribution", {"method": "integrated_gradients", "target": 2,
         "params": {"n_steps": 8}, "return_convergence_delta": True}),
        ("tabular-mlp", "attribution", {"method": "layer_integrated_gradients",
         "target": "predicted", "params": {"layer": ["fc1", "fc3"], "n_steps": 4},
         "return_convergence_delta": True}),
        ("two-input", "attribution", {"method": "saliency", "target": 0}),
        ("scripted", "attribution", {"method": "feature_ablation", "target": 1}),
        ("image-cnn", "attribution", {"method": "input_x_gradient", "target": "predicted"}),
        # token models: gradient methods rewritten onto the embedding layer
        ("text-classifier", "attribution", {"method": "integrated_gradients",
         "target": "predicted", "params": {"n_steps": 4}}),
        ("text-classifier", "attribution", {"method": "saliency", "target": 1}),
        ("text-classifier", "attribution", {"method": "feature_ablation", "target": 0}),
        ("tabular-mlp", "attack", {"method": "pgd", "params": {"radius": 0.3, "step_num": 3,
         "step_size": 0.1, "loss": "cross_entropy"}}),
        ("tabular-mlp", "counterfactual", {"perturbation": "feature_ablation",
         "params": {"arg_min": 0, "arg_max": 4, "arg_step": 1}}),
    ],
)  # fmt: skip
def test_a_job_answers_as_its_route_member_by_member(
    jobs_server: Server, model: str, route: str, body: dict[str, Any]
) -> None:
    """Every capability and model kind that takes jobs: the job's result is the synchronous
    answer, with only ``job_id`` and the timing told apart (the answer is built once)."""
    rng = np.random.default_rng(3)
    if model == "text-classifier":
        words = ["the", "film", "was", "great", "dull", "plot", "good", "bad"]
        inputs: Any = [" ".join(rng.choice(words, 2 + i % 5)) for i in range(12)]
    elif model == "two-input":
        inputs = {"a": rng.random((12, 3)).tolist(), "b": rng.random((12, 2)).tolist()}
    elif model == "image-cnn":
        inputs = rng.random((6, 3, 32, 32), dtype=np.float32).tolist()
    else:
        inputs = (rng.random((12, 4 if model == "scripted" else 8)) * 2 - 1).tolist()
    body = {**body, "inputs": inputs}
    jobs = {"attribution": "attribution-jobs", "attack": "attack-jobs"}
    sync = {"attribution": "attributions", "attack": "attacks"}
    with jobs_server.client() as c:
        r = c.post(f"/v1/models/{model}/{jobs.get(route, 'counterfactual-jobs')}", json=body,
                   headers=A)  # fmt: skip
        assert r.status_code == 202, r.text
        info = wait(c, r.json()["id"], A)
        assert info["status"] == "succeeded", info
        result = c.get(f"/v1/jobs/{info['id']}/result", headers=A).json()
        want = c.post(f"/v1/models/{model}/{sync.get(route, 'counterfactuals')}", json=body,
                      headers=A)  # fmt: skip
        assert want.status_code == 200, want.text
    assert result["job_id"] == info["id"]
    assert_same_answer(result, want.json())


def test_a_job_verifies_a_low_precision_chunk_by_chunk(jobs_server: Server) -> None:
    """verify with a precision: every chunk is checked against float32 and the result's
    fidelity is the worst chunk's; at the model's own dtype verify stays refused."""
    x = np.random.default_rng(1).random((300, 8), dtype=np.float32)
    body = {"method": "integrated_gradients", "inputs": x.tolist(), "target": 1,
            "params": {"n_steps": 16}, "precision": "bfloat16", "verify": True}  # fmt: skip
    with jobs_server.client() as c:
        job_id = submit(c, "tabular-mlp", body, A)
        assert wait(c, job_id, A)["status"] == "succeeded"
        result = c.get(f"/v1/jobs/{job_id}/result", headers=A).json()
        f = result["fidelity"]
        assert f["checked"] and f["rel_l2"] is not None and f["topk_agreement"] is not None
        want = c.post(
            "/v1/models/tabular-mlp/attributions",
            json={**body, "inputs": body["inputs"][:100], "verify": False, "precision": None},
            headers=A,
        ).json()
        got = np.asarray(result["attributions"][:100])
        ref = np.asarray(want["attributions"])
        worst = max(
            np.linalg.norm(g - r) / np.linalg.norm(r) for g, r in zip(got, ref, strict=True)
        )
        assert 0 < worst <= f["rel_l2"] * 1.01 + 1e-6  # the fidelity is the job's worst example
        r = c.post("/v1/models/tabular-mlp/attribution-jobs",
                   json={**body, "precision": None}, headers=A)  # fmt: skip
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "verify"]
