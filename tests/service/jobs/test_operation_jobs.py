"""Every operation runs as a job (CONTRACT 9.2): ``POST /v1/models/{id}/{stem}-jobs`` takes the
route's body, the job says its ``operation``, and its result is the route's response body; the
request metrics carry the operation."""

from __future__ import annotations

import re
import time
from typing import Any

import numpy as np
import pytest

from model_registry.builtin import tabular
from tests.service.conftest import Server
from tests.service.jobs.test_jobs import assert_same_answer, wait

RNG = np.random.default_rng(11)
#: (model, operation, job route's stem, body)
CASES = [
    ("tabular-mlp", "attributions", "attribution",
     {"method": "saliency", "inputs": RNG.random((5, 8)).tolist(), "target": 1}),
    ("tabular-mlp", "attacks", "attack",
     {"method": "fgsm", "inputs": RNG.random((5, 8)).tolist(), "params": {"epsilon": 0.1}}),
    ("tabular-mlp", "counterfactuals", "counterfactual",
     {"perturbation": "feature_ablation", "inputs": RNG.random((5, 8)).tolist(),
      "params": {"arg_min": 0, "arg_max": 4, "arg_step": 1}}),
    ("gpt2-dir", "context-attributions", "context-attribution",
     {"context": "alice lives in paris. bob lives in rome. carol is old.",
      "query": "who lives in paris", "answer": "alice lives in paris.", "n_ablations": 16,
      "seed": 3, "return_masks": True}),
    ("image-cnn", "tcav", "tcav",
     {"inputs": RNG.random((4, 3, 32, 32), dtype=np.float32).tolist(), "target": 0,
      "concepts": ["bright-top-left"], "random_concepts": ["random-0", "random-1", "random-2"],
      # at the logits the target's gradient is exact (one-hot): a sign count cannot flip on
      # a rounding. At features.1 it can: after the explorer's TCAV test in the same process
      # this job's p-value and its route's differed (0.170 vs 0.121), an open defect
      # (docs/concepts-and-influence.md, "TCAV and rounding")
      "layers": ["classifier.1"], "params": {"seed": 1}}),
    ("tabular-noisy", "influence", "influence",
     {"inputs": RNG.standard_normal((7, tabular.N_FEATURES)).tolist(),
      "labels": ["low", "mid", "high", "mid", "low", "high", "mid"], "k": 3, "opponents": True,
      "include_examples": True}),
]  # fmt: skip


def _influence_ready(c: Any) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if c.get("/v1/models/tabular-noisy").json()["influence"]["status"] == "ready":
            return
        time.sleep(0.1)
    raise TimeoutError("tabular-noisy's influence index")


@pytest.mark.parametrize(("model", "operation", "stem", "body"), CASES, ids=[c[1] for c in CASES])
def test_every_operation_runs_as_a_job_answering_as_its_route(
    server: Server, model: str, operation: str, stem: str, body: dict[str, Any]
) -> None:
    with server.client() as c:
        if operation == "influence":
            _influence_ready(c)
        r = c.post(f"/v1/models/{model}/{stem}-jobs", json=body)
        assert r.status_code == 202, r.text
        assert r.json()["operation"] == operation
        info = wait(c, r.json()["id"], {}, timeout=120)
        assert info["status"] == "succeeded", info
        assert info["operation"] == operation
        assert any(j["id"] == info["id"] and j["operation"] == operation
                   for j in c.get("/v1/jobs").json()["jobs"])  # fmt: skip
        result = c.get(f"/v1/jobs/{info['id']}/result").json()
        want = c.post(f"/v1/models/{model}/{operation}", json=body)
        assert want.status_code == 200, want.text
        npz = c.get(f"/v1/jobs/{info['id']}/result", params={"format": "npz"})
        metrics = c.get("/metrics").text
    assert result["job_id"] == info["id"]
    want_body = want.json()
    if operation == "tcav":  # what it computed: the job filled the cache the route then read
        assert result.pop("computed") > 0 and want_body.pop("computed") == 0
    assert_same_answer(result, want_body)
    arrays = operation in ("attributions", "attacks", "counterfactuals")
    assert npz.status_code == (200 if arrays else 422), npz.text
    if not arrays:
        assert npz.json()["errors"][0]["loc"] == ["query", "format"]
    label = re.compile(
        rf'attrserve_requests_total\{{method="[^"]*",model="{model}",'
        rf'operation="{operation}",status="200"\}}'
    )
    assert label.search(metrics), operation


def test_a_job_checks_its_body_as_its_route_does(server: Server) -> None:
    """A bad body is refused at submission with the route's own 4xx."""
    with server.client() as c:
        bad_tcav = {**CASES[4][3], "concepts": ["no-such-set"]}
        r = c.post("/v1/models/image-cnn/tcav-jobs", json=bad_tcav)
        assert r.status_code == 404, r.text
        r = c.post("/v1/models/tabular-mlp/context-attribution-jobs", json=CASES[3][3])
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"] == ["path", "model_id"]
        r = c.post("/v1/models/tabular-noisy/influence-jobs", json={**CASES[5][3], "k": 10**6})
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "k"], r.text
        r = c.post("/v1/models/image-cnn/tcav-jobs", json={**CASES[4][3], "render": {}})
        assert r.status_code == 422, r.text
