"""Clients generated from the live server's /openapi.json, used against it as their users would:
openapi-python-client (a dev dependency) always; openapi-typescript + openapi-fetch, type-checked
by ``tsc --strict`` and run with node, where node and npm can install them (tests/service/
ts_client). Numbers are checked, not just shapes: integrated gradients' completeness, occlusion's
patches, saliency of a linear two-input model; and a picture from the render operation. Nothing
generated is edited: every generated module must import as it is."""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import pkgutil
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import methods
from tests.service.conftest import Server

pytestmark = pytest.mark.processes  # openapi-python-client and node

TS_CLIENT = Path(__file__).resolve().parent / "ts_client"
PACKAGE = "attrserve_generated_client"
X = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], [1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0]]
PNG = b"\x89PNG\r\n\x1a\n"
#: npm's words for "the registry cannot be reached": the TypeScript check is skipped then
OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "ENETUNREACH")


def _pascal(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


@pytest.fixture(scope="module")
def spec_path(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "openapi.json"
    path.write_bytes(httpx.get(server.url + "/openapi.json", timeout=30).content)
    return path


@pytest.fixture(scope="module")
def package(spec_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The Python client, generated once for the module and importable as ``PACKAGE``."""
    pytest.importorskip("openapi_python_client")
    root = tmp_path_factory.mktemp("python_client")
    config = root / "config.yaml"
    config.write_text("post_hooks: []\n")  # no formatter: the code is imported, not read
    cmd = [
        *(sys.executable, "-m", "openapi_python_client", "generate"),
        *("--path", str(spec_path), "--output-path", str(root / PACKAGE)),
        *("--meta", "none", "--config", str(config), "--fail-on-warning"),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    sys.path.insert(0, str(root))
    try:
        yield root / PACKAGE
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.partition(".")[0] == PACKAGE]:
            del sys.modules[name]


def _mod(name: str) -> Any:
    return importlib.import_module(f"{PACKAGE}.{name}")


@pytest.fixture(scope="module")
def models(package: Path) -> Any:
    return _mod("models")


@pytest.fixture(scope="module")
def client(package: Path, server: Server) -> Iterator[Any]:
    # a key in X-API-Key, as a keyed server takes it (this one has none, and ignores it)
    with _mod("client").AuthenticatedClient(
        base_url=server.url,
        token="unused",
        prefix="",
        auth_header_name="X-API-Key",
        timeout=httpx.Timeout(60),
        raise_on_unexpected_status=True,
    ) as client:
        yield client


def _attribute(client: Any, model_id: str, body: Any) -> Any:
    return _mod("api.attributions.attribute").sync(model_id, client=client, body=body)


def _decode(t: Any) -> np.ndarray:
    """A TensorB64 from the generated client as an array."""
    raw = base64.b64decode(t.b64)
    return np.frombuffer(raw, dtype=np.dtype(t.dtype).newbyteorder("<")).reshape(t.shape)


def test_every_module_imports(package: Path) -> None:
    """A user may import any operation: each generated module imports as generated (an
    operation with two request media types once wrote ``Unset`` without importing it)."""
    names = [m.name for m in pkgutil.walk_packages([str(package)], PACKAGE + ".")]
    assert f"{PACKAGE}.api.oip.infer" in names and f"{PACKAGE}.api.attributions.render" in names
    for name in names:
        importlib.import_module(name)


def test_operations_and_params_classes(package: Path, models: Any) -> None:
    """Modules are named for the short operation ids; every method has its request and params
    classes."""
    api = package / "api"
    files = {p.relative_to(api).as_posix() for p in api.rglob("*.py") if p.stem != "__init__"}
    assert {
        "attributions/attribute.py",
        "attributions/render.py",
        "catalog/list_models.py",
        "catalog/get_model.py",
        "catalog/list_methods.py",
        "health/live.py",
        "health/ready.py",
    } <= files
    ours = [f for f in files if f.split("/")[0] in ("attributions", "catalog", "health")]
    assert all("_v1_" not in f and len(f) < 40 for f in ours), ours
    for info in methods.available():
        stem = _pascal(info.name)
        assert hasattr(models, stem + "Request") and hasattr(models, stem + "Params"), stem


def test_list_models(client: Any, models: Any) -> None:
    listed = _mod("api.catalog.list_models").sync(client=client)
    assert isinstance(listed, models.ModelList)
    assert {"tabular-mlp", "image-cnn"} <= {m.id for m in listed.models}


def test_integrated_gradients_tabular(client: Any, models: Any) -> None:
    """Typed params, nested-list inputs; completeness: sum(attributions) - (f(x) - f(0)) is the
    convergence delta the server reports."""
    method = models.IntegratedGradientsParamsApproximationMethod.GAUSSLEGENDRE
    body = models.IntegratedGradientsRequest(
        method="integrated_gradients",
        inputs=X,
        target=1,
        params=models.IntegratedGradientsParams(n_steps=64, approximation_method=method),
        return_convergence_delta=True,
    )
    res = _attribute(client, "tabular-mlp", body)
    assert isinstance(res, models.AttributionResponse)
    attr = np.asarray(res.attributions, dtype=np.float64)
    assert attr.shape == (2, 8)
    assert res.params.additional_properties["n_steps"] == 64
    zero = _attribute(
        client,
        "tabular-mlp",
        models.SaliencyRequest(method="saliency", inputs=[[0.0] * 8], target=1),
    )
    f0 = zero.outputs[0]
    delta = np.asarray(res.convergence_delta)
    gap = attr.sum(axis=1) - (np.asarray(res.outputs) - f0)
    np.testing.assert_allclose(gap, delta, atol=1e-5)


def test_occlusion_image(client: Any, models: Any) -> None:
    """A base64 input and base64 results: with windows as large as the strides, each 8x8 patch
    scores f(x) - f(x with the patch zeroed), checked against the model's own outputs."""
    x = np.random.default_rng(0).random((1, 3, 32, 32), dtype=np.float32)
    tensor = models.TensorB64(
        dtype="float32",
        shape=[1, 3, 32, 32],
        b64=base64.b64encode(x.astype("<f4").tobytes()).decode(),
    )
    body = models.OcclusionRequest(
        method="occlusion",
        inputs=tensor,
        target=0,
        params=models.OcclusionParams(sliding_window_shapes=[3, 8, 8], strides=[3, 8, 8]),
        output_encoding=models.OutputEncoding.BASE64,
    )
    res = _attribute(client, "image-cnn", body)
    attr = _decode(res.attributions)
    assert attr.shape == (1, 3, 32, 32)
    patches = attr.reshape(3, 4, 8, 4, 8).transpose(1, 3, 0, 2, 4).reshape(16, -1)
    np.testing.assert_allclose(patches, patches[:, :1].repeat(patches.shape[1], 1), atol=1e-6)
    occluded = x.copy()
    occluded[..., :8, :8] = 0
    plain = _attribute(
        client,
        "image-cnn",
        models.SaliencyRequest(method="saliency", inputs=occluded.tolist(), target=0),
    )
    fx = float(_decode(res.outputs)[0])
    assert attr[0, 0, 0, 0] == pytest.approx(fx - plain.outputs[0], abs=1e-4)


def test_texts_and_inputs_by_name(client: Any, models: Any) -> None:
    """Raw texts on a token model; inputs by name on a two-input model whose gradients are
    known: out0 = a.sum() + 2 b0."""
    texts = _attribute(
        client,
        "text-classifier",
        models.IntegratedGradientsRequest(
            method="integrated_gradients", inputs=["a wonderful film"], target="positive"
        ),
    )
    assert isinstance(texts.tokens, list) and len(texts.tokens[0]) == len(texts.attributions[0])
    named = models.TensorsByName.from_dict({"a": [[1.0, 2.0, 3.0]], "b": [[4.0, 5.0]]})
    res = _attribute(
        client,
        "two-input",
        models.SaliencyRequest(method="saliency", inputs=named, target=0),
    )
    a, b = res.attributions
    assert a == [[1.0, 1.0, 1.0]] and b == [[2.0, 0.0]]


def test_render_a_picture(client: Any, models: Any) -> None:
    """The render operation answers the picture: a PNG bar chart of one tabular example (the
    generator reads an image/png body as text, so its bytes are the response's content), and
    highlighted tokens as HTML."""
    render = _mod("api.attributions.render")
    body = models.IntegratedGradientsRequest(method="integrated_gradients", inputs=X[:1], target=1)
    res = render.sync_detailed("tabular-mlp", client=client, body=body)
    assert res.status_code == 200 and res.headers["content-type"] == "image/png"
    assert res.content.startswith(PNG) and len(res.content) > 1000
    html = render.sync(
        "text-classifier",
        client=client,
        body=models.IntegratedGradientsRequest(
            method="integrated_gradients",
            inputs=["a wonderful film"],
            target="positive",
            render=models.RenderSpec(format_=models.RenderSpecFormat.HTML),
        ),
    )
    assert isinstance(html, str) and "wonderful" in html and "<" in html
    # two examples cannot be one picture: a Problem, before any work
    two = render.sync(
        "tabular-mlp",
        client=client,
        body=models.SaliencyRequest(method="saliency", inputs=X, target=1),
    )
    assert isinstance(two, models.Problem) and two.status == 422


def test_problem_422(client: Any, models: Any) -> None:
    """A target out of range is a 422 whose body parses as the Problem model."""
    body = models.IntegratedGradientsRequest(method="integrated_gradients", inputs=X, target=99)
    res = _mod("api.attributions.attribute").sync_detailed("tabular-mlp", client=client, body=body)
    assert res.status_code == 422
    problem = res.parsed
    assert isinstance(problem, models.Problem)
    assert problem.status == 422 and problem.type_.endswith("/invalid_request")
    assert ["body", "target"] in [e.loc for e in problem.errors]
    assert problem.request_id == res.headers["x-request-id"]


# --- TypeScript: openapi-typescript + openapi-fetch -------------------------------------------


def _npm_ci(npm: str) -> None:
    """``npm ci`` into ts_client/node_modules, once per lock file (a stamp records which)."""
    lock = TS_CLIENT / "package-lock.json"
    digest = hashlib.sha256(lock.read_bytes() + (TS_CLIENT / "package.json").read_bytes())
    stamp = TS_CLIENT / "node_modules" / ".attrserve-lock"
    if stamp.is_file() and stamp.read_text() == digest.hexdigest():
        return
    run = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=TS_CLIENT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if run.returncode != 0:
        tail = (run.stdout + run.stderr)[-800:]
        if any(code in tail for code in OFFLINE):
            pytest.skip(f"npm ci cannot reach the registry: {tail}")
        pytest.fail(f"npm ci failed:\n{tail}")
    stamp.write_text(digest.hexdigest())


def test_typescript_client(server: Server, spec_path: Path) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("the TypeScript client check needs node and npm on PATH")
    _npm_ci(npm)
    bin_ = TS_CLIENT / "node_modules" / ".bin"

    def run(*cmd: str) -> str:
        done = subprocess.run(cmd, cwd=TS_CLIENT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout}{done.stderr}"
        return done.stdout

    run(str(bin_ / "openapi-typescript"), str(spec_path), "-o", "schema.d.ts")
    run(str(bin_ / "tsc"), "-p", "tsconfig.json")  # strict (tsconfig.json), then emits build/
    out = json.loads(run(node, "build/main.js", server.url).strip().splitlines()[-1])
    assert "tabular-mlp" in out["models"]
    assert np.asarray(out["attributions"]).shape == (2, 8)
    assert max(abs(g) for g in out["gaps"]) < 1e-4
    assert out["problem"]["status"] == 422
    assert out["model_id"] == "tabular-mlp"
    assert out["png"] == list(PNG) and out["png_bytes"] > 1000
