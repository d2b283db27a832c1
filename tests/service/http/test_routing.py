"""The one router: each route's policy (key, body limit, fast handler) is read from its own
declaration, and the route found for a request is the one FastAPI serves."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.routing import Mount

from service.app import create_app
from service.core.settings import ApiKey, Settings
from service.http.routing import RouteTable, flat

SETTINGS = Settings(
    max_body_bytes=2_000,
    max_job_body_bytes=50_000,
    api_keys=(ApiKey(key="k", models=("tabular-mlp",)),),
)
#: the routes open without a key, as the API has always had them
OPEN = {
    "/",
    "/v2",
    "/v1/health/live",
    "/v1/health/ready",
    "/v2/health/live",
    "/v2/health/ready",
    "/metrics",
    "/docs",
    "/docs/assets",
    "/redoc",
    "/openapi.json",
    "/ui",
    "/ui/{name}",
}
#: the routes a fast handler serves (the attribution route, KServe's and OIP's model routes)
FAST = {
    "/v1/models/{model_id}/attributions",
    "/v1/models/{model_id}:predict",
    "/v1/models/{model_id}:explain",
    "/v2/models/{model_id}/infer",
    "/v2/models/{model_id}/versions/{version}/infer",
    "/v2/models/{model_id}/explain",
    "/v2/models/{model_id}/versions/{version}/explain",
}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(SETTINGS, start_workers=False)) as c:
        yield c


def _sample(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "m", path)


def test_every_route_is_found_by_its_own_path(client: TestClient) -> None:
    app = client.app
    table = RouteTable(app.routes)  # type: ignore[attr-defined]
    routes = flat(app.routes)  # type: ignore[attr-defined]
    assert len(routes) > 40
    for route in routes:
        path = getattr(route, "path")  # noqa: B009
        sample = _sample(path) + ("/file.js" if isinstance(route, Mount) else "")
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            scope = {"type": "http", "method": method, "path": sample, "root_path": ""}
            found = table.find(scope)
            assert found.route is route and found.full, (method, path, found.template)
            assert found.params == {k: "m" for k in re.findall(r"\{([^}]+)\}", path)}
    # a path no route has: keyed (a 401 before the 404 where keys are on), nothing fast
    nowhere = table.find({"type": "http", "method": "GET", "path": "/v1/nowhere"})
    assert nowhere.route is None and nowhere.policy.keyed and nowhere.policy.fast is None
    assert {p for p, policy in table.policies().items() if not policy.keyed} == OPEN
    assert {p for p, policy in table.policies().items() if policy.fast is not None} == FAST
    jobs = {p for p, policy in table.policies().items() if policy.job_body}
    stems = (
        "attribution",
        "context-attribution",
        "attack",
        "counterfactual",
        "tcav",
        "influence",
        "dependence",
    )
    assert jobs == {f"/v1/models/{{model_id}}/{stem}-jobs" for stem in stems}


def test_keys_and_body_limits_follow_the_declarations(client: TestClient) -> None:
    assert client.get("/v1/health/live").status_code == 200  # open
    assert client.get("/ui").status_code == 200
    assert client.get("/v1/models").status_code == 401  # keyed
    assert client.get("/v1/models", headers={"x-api-key": "k"}).status_code == 200
    # a model route checks the model its own path parameter names
    other = client.get("/v1/models/image-cnn", headers={"x-api-key": "k"})
    assert other.status_code == 403
    kserve = client.post("/v1/models/image-cnn:predict", headers={"x-api-key": "k"}, json={})
    assert kserve.status_code == 403
    # a job submission takes bodies over the synchronous limit (then fails for want of
    # workers, past the limit); the synchronous route does not
    big = {"method": "saliency", "inputs": [[0.5] * 8] * 60}
    sync = client.post("/v1/models/tabular-mlp/attributions", headers={"x-api-key": "k"}, json=big)
    assert sync.status_code == 413
    job = client.post(
        "/v1/models/tabular-mlp/attribution-jobs", headers={"x-api-key": "k"}, json=big
    )
    assert job.status_code != 413
    huge = {"method": "saliency", "inputs": [[0.5] * 8] * 2000}
    job = client.post(
        "/v1/models/tabular-mlp/attribution-jobs", headers={"x-api-key": "k"}, json=huge
    )
    assert job.status_code == 413


def test_a_trailing_slash_is_redirected_not_served_fast(client: TestClient) -> None:
    r = client.post(
        "/v1/models/tabular-mlp/attributions/",
        headers={"x-api-key": "k"},
        json={"method": "saliency", "inputs": [[0.5] * 8]},
        follow_redirects=False,
    )
    assert r.status_code == 307
