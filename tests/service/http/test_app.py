"""The app without workers: catalogue routes, every check made before the queue, errors, keys."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator

import orjson
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.core.settings import ApiKey, Settings

X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]]
ATTR = "/v1/models/tabular-mlp/attributions"


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    settings = Settings(max_body_bytes=200_000, max_n_steps=500, max_cost=100_000)
    with TestClient(create_app(settings, start_workers=False)) as c:
        yield c


def problem(r: object, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text  # type: ignore[attr-defined]
    assert r.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    body: dict[str, object] = r.json()  # type: ignore[attr-defined]
    assert body["status"] == status and body["title"] and body["type"] and body["detail"]
    return body


def test_health_and_catalogue(client: TestClient) -> None:
    assert client.get("/v1/health/live").json() == {"status": "ok"}
    assert client.get("/v1/health/ready").status_code == 503  # no worker has loaded
    models = {m["id"]: m for m in client.get("/v1/models").json()["models"]}
    assert {"tabular-mlp", "image-cnn", "text-classifier"} <= set(models)
    tab = client.get("/v1/models/tabular-mlp").json()
    names = ["signal_0", "noise_1", "noise_2", "signal_3"] + [f"noise_{i}" for i in (4, 5, 6, 7)]
    assert tab["inputs"] == [
        {"name": "x", "dtype": "float32", "shape": [None, 8], "features": names}
    ]
    assert tab["output"]["labels"] and "integrated_gradients" in tab["methods"]
    text = models["text-classifier"]
    assert text["embedding_layer"] == "embedding" and text["tokenizer"] is True
    methods = {m["name"]: m for m in client.get("/v1/methods").json()["methods"]}
    assert "n_steps" in methods["integrated_gradients"]["params"]["properties"]
    assert b"attrserve_requests" in client.get("/metrics").content


def test_unknown_model_and_method(client: TestClient) -> None:
    problem(client.get("/v1/models/nope"), 404)
    body = problem(
        client.post("/v1/models/nope/attributions", json={"method": "saliency", "inputs": X}), 404
    )
    assert body["errors"][0]["loc"] == ["path", "model_id"]  # type: ignore[index]
    body = problem(
        client.post(ATTR, json={"method": "integrated_gradient", "inputs": X, "target": 1}), 404
    )
    assert "integrated_gradients" in str(body["detail"])


def test_malformed_body_is_400(client: TestClient) -> None:
    problem(
        client.post(ATTR, content=b"{not json", headers={"content-type": "application/json"}), 400
    )
    problem(client.post(ATTR, content=b"[1, 2]", headers={"content-type": "application/json"}), 400)


def test_deeply_nested_json_is_400(client: TestClient) -> None:
    """JSON nested past orjson's 1,024 levels used to reach the stdlib's parser, whose
    recursion gave a 500."""
    deep = b"[" * 10_000 + b"]" * 10_000
    headers = {"content-type": "application/json"}
    for path in (
        ATTR,
        "/v1/models/tabular-mlp:predict",
        "/v1/models/tabular-mlp:explain",
        "/v2/models/tabular-mlp/explain",
    ):
        for body in (deep, b'{"method": "saliency", "inputs": ' + deep + b"}"):
            detail = str(problem(client.post(path, content=body, headers=headers), 400)["detail"])
            assert "deeper than 1024 levels" in detail or "depth limit" in detail, detail


def test_schema_errors_are_422_with_loc(client: TestClient) -> None:
    body = problem(client.post(ATTR, json={"inputs": X}), 422)
    assert body["errors"][0]["loc"] == ["body", "method"]  # type: ignore[index]
    body = problem(client.post(ATTR, json={"method": "saliency", "inputs": X, "bogus": 1}), 422)
    assert body["errors"][0]["loc"] == ["body", "bogus"]  # type: ignore[index]


def test_body_limit_is_413(client: TestClient) -> None:
    big = {"method": "saliency", "inputs": [[0.5] * 8] * 20_000, "target": 0}
    problem(
        client.post(ATTR, content=orjson.dumps(big), headers={"content-type": "application/json"}),
        413,
    )


@pytest.mark.parametrize(
    ("body", "loc", "match"),
    [
        ({"inputs": [[0.1] * 7]}, ["body", "inputs"], "dim 1 must be 8"),
        ({"inputs": [[float("nan")] * 8]}, ["body", "inputs"], "NaN"),
        ({"inputs": [[float("inf")] * 8]}, ["body", "inputs"], "infinity"),
        ({"inputs": [[None] * 8]}, ["body", "inputs"], "null"),
        (
            {"inputs": {"dtype": "int64", "shape": [1, 8], "b64": ""}},
            ["body", "inputs", "dtype"],
            "float32",
        ),
        ({"target": 7}, ["body", "target"], "out of range"),
        ({"target": "cat"}, ["body", "target"], "unknown label"),
        ({"target": None}, ["body", "target"], "required"),
        ({"params": {"n_steps": 10_000}}, ["body", "params", "n_steps"], "limit"),
        ({"params": {"n_steps": 400}, "inputs": [[0.1] * 8] * 256}, ["body"], "cost"),
        ({"inputs": [[0.1] * 8] * 300}, ["body", "inputs"], "examples"),
        ({"internal_batch_size": 10**6}, ["body", "internal_batch_size"], "cap"),
        ({"inputs": ["some text"]}, ["body", "inputs"], "no tokenizer"),
        (
            {"method": "layer_conductance", "params": {"layer": "nope"}},
            ["body", "params", "layer"],
            "not exposed",
        ),
        (
            {"method": "layer_conductance", "params": {"layer": ["fc1", "nope"]}},
            ["body", "params", "layer", 1],
            "not exposed",
        ),
        (
            {"method": "layer_conductance", "params": {"layer": []}},
            ["body", "params", "layer"],
            "empty list",
        ),
        (
            {"method": "neuron_gradient", "params": {"layer": ["fc1"], "neuron_selector": 0}},
            ["body", "params", "layer"],
            "takes one layer",
        ),
    ],
)
def test_unservable_requests_are_422(
    client: TestClient, body: dict[str, object], loc: list[object], match: str
) -> None:
    req = {"method": "integrated_gradients", "inputs": X, "target": 1, **body}
    # json.dumps, not orjson: it writes NaN and Infinity literals, as many clients do
    err = problem(
        client.post(ATTR, content=json.dumps(req), headers={"content-type": "application/json"}),
        422,
    )
    assert err["errors"][0]["loc"] == loc  # type: ignore[index]
    assert match in str(err["detail"])


X2 = [X[0], [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]]
OIP_X2 = [{"name": "x", "shape": [2, 8], "datatype": "FP32", "data": X2}]
NOISE = {"arg_min": 0, "arg_max": 4, "arg_step": 0.5}


@pytest.mark.parametrize(
    ("path", "body", "at", "loc"),
    [
        (ATTR, {"method": "saliency", "inputs": X2}, (), ["body", "target"]),
        (
            ATTR,
            {"method": "saliency", "inputs": X2, "metrics": {"infidelity": {}}},
            (),
            ["body", "target"],
        ),
        (ATTR + ":render", {"method": "saliency", "inputs": X2}, (), ["body", "target"]),
        (
            "/v1/models/tabular-mlp/attacks",
            {"method": "fgsm", "inputs": X2, "params": {"epsilon": 0.1}},
            (),
            ["body", "target"],
        ),
        (
            "/v1/models/tabular-mlp/counterfactuals",
            {"perturbation": "gaussian_noise", "inputs": X2, "params": NOISE},
            (),
            ["body", "target"],
        ),
        (
            "/v1/models/tabular-mlp:explain",
            {"instances": X2, "parameters": {"method": "saliency"}},
            ("parameters",),
            ["body", "parameters", "target"],
        ),
        (
            "/v2/models/tabular-mlp/explain",
            {"inputs": OIP_X2, "parameters": {"method": "saliency"}},
            ("parameters",),
            ["body", "parameters", "target"],
        ),
    ],
)
@pytest.mark.parametrize(
    "target", [-1, [1, -1], {"index": [-1]}, [{"index": [0]}, {"index": [-3]}]]
)
def test_a_target_below_zero_is_422_on_every_route(
    client: TestClient,
    path: str,
    body: dict[str, object],
    at: tuple[str, ...],
    loc: list[object],
    target: object,
) -> None:
    """CONTRACT 9.1: ``-1`` used to reach the workers and explain the last class (200)."""
    req = json.loads(json.dumps(body))
    (req[at[0]] if at else req)["target"] = target
    err = problem(client.post(path, json=req), 422)
    assert err["errors"][0]["loc"][: len(loc)] == loc  # type: ignore[index]
    assert "counts from 0" in str(err["detail"]), err


def test_a_cost_refusal_says_what_would_fix_it(client: TestClient) -> None:
    image = [[[[0.5] * 32] * 32] * 3]
    body = {"method": "shapley_values", "inputs": image, "target": 0}
    err = problem(client.post("/v1/models/image-cnn/attributions", json=body), 422)
    assert "params.feature_mask" in str(err["detail"]), err
    # with a mask the cost is the groups' (4 quadrants: 4! orderings), within the limit
    mask = [[[[(i // 16) * 2 + j // 16 for j in range(32)] for i in range(32)]] * 3]
    masked = {**body, "params": {"feature_mask": mask}}
    assert client.post("/v1/models/image-cnn/attributions", json=masked).status_code == 503
    # methods whose cost does not grow with the features say the usual
    err = problem(
        client.post(
            ATTR,
            json={
                "method": "integrated_gradients",
                "inputs": X * 250,
                "target": 1,
                "params": {"n_steps": 500},
            },
        ),
        422,
    )
    assert "feature_mask" not in str(err["detail"]) and "fewer examples" in str(err["detail"])


def test_a_kserve_verb_without_its_colon_says_so(client: TestClient) -> None:
    for verb in ("explain", "predict"):
        err = problem(client.post(f"/v1/models/tabular-mlp/{verb}", json={"instances": X}), 404)
        assert f"POST /v1/models/tabular-mlp:{verb}" in str(err["detail"])
    problem(client.post("/v1/models/tabular-mlp/nothing", json={}), 404)


def test_no_workers_is_503(client: TestClient) -> None:
    problem(client.post(ATTR, json={"method": "saliency", "inputs": X, "target": 1}), 503)


def test_api_keys() -> None:
    keys = (
        ApiKey(key="tab-only", models=("tabular-mlp",)),
        ApiKey(sha256=hashlib.sha256(b"all-models").hexdigest()),
    )
    with TestClient(create_app(Settings(api_keys=keys), start_workers=False)) as c:
        assert c.get("/v1/health/live").status_code == 200
        assert c.get("/v1/health/ready").status_code == 503  # open, just not ready
        assert c.get("/metrics").status_code == 200
        problem(c.get("/v1/models"), 401)
        problem(c.get("/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        listed = c.get("/v1/models", headers={"X-API-Key": "tab-only"}).json()["models"]
        assert [m["id"] for m in listed] == ["tabular-mlp"]
        problem(c.get("/v1/models/image-cnn", headers={"X-API-Key": "tab-only"}), 403)
        problem(
            c.post(
                "/v1/models/image-cnn/attributions",
                json={"method": "saliency", "inputs": X},
                headers={"X-API-Key": "tab-only"},
            ),
            403,
        )
        problem(c.post(ATTR, json={"method": "saliency", "inputs": X}), 401)
        ok = c.get("/v1/models/image-cnn", headers={"Authorization": "Bearer all-models"})
        assert ok.status_code == 200


def test_settings_from_env() -> None:
    s = Settings.from_env(
        {
            "ATTRSERVE_WORKERS": "2",
            "ATTRSERVE_BATCHING": "false",
            "ATTRSERVE_INTERNAL_BATCH_SIZE": "64",
            "ATTRSERVE_PERTURBATIONS_PER_EVAL": "auto",
            "ATTRSERVE_API_KEYS": '[{"key": "k", "models": ["tabular-mlp"]}]',
            "ATTRSERVE_MODELS": "",
            "UNRELATED": "x",
        }
    )
    assert s.workers == 2 and s.batching is False and s.internal_batch_size == 64
    assert s.perturbations_per_eval == "auto" and s.models is None
    assert s.api_keys[0].allows("tabular-mlp") and not s.api_keys[0].allows("image-cnn")
    with pytest.raises(SystemExit, match="ATTRSERVE_WORKERS"):
        Settings.from_env({"ATTRSERVE_WORKERS": "many"})


def test_an_operations_settings_are_its_section_read_from_the_same_variables() -> None:
    """Context attributions own their limits (service/contexts/settings.py): read from
    ATTRSERVE_* like the server's, an override wins, a bad value or a setting nobody takes
    stops the start naming it; no section repeats a name of the server's settings."""
    from service.app import OPERATIONS
    from service.contexts.settings import ContextSettings

    env = {"ATTRSERVE_MAX_CONTEXT_UNITS": "9", "ATTRSERVE_WORKERS": "1"}
    s = Settings.from_env(env, max_answer_tokens=7)
    own = s.section(ContextSettings)
    assert (own.max_context_units, own.max_answer_tokens, own.max_context_tokens) == (9, 7, 4096)
    assert s.workers == 1 and "max_context_units" not in Settings.model_fields
    with pytest.raises(SystemExit, match="ATTRSERVE_MAX_CONTEXT_UNITS"):
        Settings.from_env({"ATTRSERVE_MAX_CONTEXT_UNITS": "0"}).section(ContextSettings)
    with pytest.raises(SystemExit, match="ATTRSERVE_MAX_ANSWER_TOKENS"):
        create_app(Settings.from_env({}, max_answer_tokens="many"), start_workers=False)
    with pytest.raises(SystemExit, match=r"no setting is named max_answer_token$"):
        create_app(Settings.from_env({}, max_answer_token=3), start_workers=False)
    sections = [op.section for op in OPERATIONS if op.section is not None]
    assert ContextSettings in sections
    for section in sections:
        assert not set(section.model_fields) & set(Settings.model_fields), section


def test_large_responses_are_gzipped_at_the_set_level() -> None:
    """Responses over ATTRSERVE_GZIP_MIN_BYTES are gzipped for clients that accept it, at
    ATTRSERVE_GZIP_LEVEL (1 by default: a few ms of CPU rather than level 9's tens)."""
    sizes = {}
    for level in (1, 9):
        app = create_app(Settings(gzip_level=level), start_workers=False)
        with TestClient(app) as c:
            r = c.get("/openapi.json", headers={"Accept-Encoding": "gzip"})
            assert r.headers["content-encoding"] == "gzip" and r.json()["openapi"]
            sizes[level] = r.num_bytes_downloaded
            plain = c.get("/openapi.json", headers={"Accept-Encoding": "identity"})
            assert "content-encoding" not in plain.headers
            assert plain.num_bytes_downloaded > sizes[level]
    assert sizes[1] > sizes[9]


@pytest.mark.parametrize(
    ("body", "loc", "hint"),
    [
        ({"method": "saliency", "inputs": X, "targets": 0}, ["body", "targets"], "'target'"),
        (
            {"method": "saliency", "inputs": X, "target": 0, "metrics": {"infidelty": {}}},
            ["body", "metrics", "infidelty"],
            "'infidelity'",
        ),
        (
            {"method": "saliency", "inputs": X, "target": 0, "render": {"fromat": "png"}},
            ["body", "render", "fromat"],
            "'format'",
        ),
    ],
)
def test_an_unknown_field_names_the_nearest_and_the_known_ones(
    client: TestClient, body: dict[str, object], loc: list[str], hint: str
) -> None:
    """Not "Extra inputs are not permitted": which field was meant, and which there are."""
    got = problem(client.post(ATTR, json=body), 422)
    (err,) = got["errors"]  # type: ignore[misc]
    assert err["loc"] == loc
    assert f"did you mean {hint}?" in err["msg"] and "the fields here:" in err["msg"]
    assert hint in str(got["detail"])


def test_a_wrong_http_method_says_which_the_route_takes(client: TestClient) -> None:
    r = client.get(ATTR)
    body = problem(r, 405)
    assert r.headers["allow"] == "POST"
    assert body["detail"] == f"{ATTR} does not take GET; it takes POST"


def test_a_trailing_slash_redirects_with_a_body_saying_why(client: TestClient) -> None:
    """Starlette's redirect had an empty body, which curl shows as nothing at all."""
    r = client.get("/v1/models/?page=1", follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == "/v1/models?page=1"
    assert "without the trailing slash" in r.json()["detail"]
    assert client.get("/v1/models/").status_code == 200  # followed, it serves
    assert client.get("/nowhere/", follow_redirects=False).status_code == 404
