"""KServe V1 and Open Inference Protocol v2 routes, end to end with a real server, driven by the
clients their users run: KServe's ``InferenceRESTClient`` and Triton's ``tritonclient.http``."""

from __future__ import annotations

import asyncio
import gzip
import struct
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import torch

import model_registry
from tests.service.conftest import Server

http = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is a dev dependency")
kserve = pytest.importorskip("kserve", reason="kserve is a dev dependency")

TAB = np.array(
    [[1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0], [-1.2, 0.5, 0.3, -0.8, 0.2, 0.1, -0.3, 0.6]],
    dtype=np.float32,
)


def outputs_of(model_id: str, *xs: np.ndarray) -> np.ndarray:
    """The built-in model's own outputs, computed here (not by the server)."""
    spec = next(s for s in model_registry.load_specs(None) if s.id == model_id)
    lm = model_registry.load(spec)
    with torch.no_grad():
        out: torch.Tensor = lm.model(*(torch.from_numpy(x) for x in xs))
    return out.numpy()


def image_batch(n: int = 2) -> np.ndarray:
    from model_registry.builtin import image

    x, _ = image.make_data(n, torch.Generator().manual_seed(7))
    return x.numpy()


def attributions(server: Server, model: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def kserve_client(protocol: str) -> Any:
    return kserve.InferenceRESTClient(kserve.RESTConfig(protocol=protocol, retries=0))


def kserve_explain(server: Server, model: str, body: dict[str, Any]) -> Any:
    """``:explain`` through KServe's own V1 client."""

    async def go() -> Any:
        client = kserve_client("v1")
        try:
            return await client.explain(server.url, model, body)
        finally:
            await client.close()

    return run(go())


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# -- KServe V1 ------------------------------------------------------------------------------
def test_v1_health_and_model_with_the_kserve_client(server: Server) -> None:
    async def go() -> tuple[bool, bool]:
        client = kserve_client("v1")
        try:
            return (
                await client.is_server_live(server.url),
                await client.is_model_ready(server.url, "tabular-mlp"),
            )
        finally:
            await client.close()

    assert run(go()) == (True, True)
    info = httpx.get(f"{server.url}/v1/models/image-cnn").json()
    assert info["name"] == "image-cnn" and info["ready"] is True


def test_v1_predict_equals_the_models_outputs(server: Server) -> None:
    async def go() -> Any:
        client = kserve_client("v1")
        try:
            return await client.infer(server.url, {"instances": TAB.tolist()}, "tabular-mlp")
        finally:
            await client.close()

    got = np.array(run(go())["predictions"], dtype=np.float32)
    np.testing.assert_allclose(got, outputs_of("tabular-mlp", TAB), rtol=1e-5, atol=1e-5)
    # the attributions route's input forms work too: base64 tensors under "inputs"
    x = image_batch(2)
    body = {"inputs": {"dtype": "float32", "shape": list(x.shape), "b64": _b64(x)}}
    r = httpx.post(f"{server.url}/v1/models/image-cnn:predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(
        np.array(r.json()["predictions"]), outputs_of("image-cnn", x), rtol=1e-4, atol=1e-4
    )


def _b64(x: np.ndarray) -> str:
    import base64

    return base64.b64encode(np.ascontiguousarray(x, dtype="<f4").tobytes()).decode()


def test_v1_explain_equals_the_attributions_route(server: Server) -> None:
    params = {"method": "integrated_gradients", "target": 1, "params": {"n_steps": 32}}
    params["return_convergence_delta"] = True

    got = kserve_explain(server, "tabular-mlp", {"instances": TAB.tolist(), "parameters": params})
    want = attributions(server, "tabular-mlp", {**params, "inputs": TAB.tolist()})
    assert got["method"] == want["method"] and got["params"] == want["params"]
    for i, e in enumerate(got["explanations"]):
        np.testing.assert_allclose(e["attributions"], want["attributions"][i], rtol=1e-6)
        assert e["target"] == want["target"][i]
        assert e["output"] == pytest.approx(want["outputs"][i], rel=1e-6)
        assert e["convergence_delta"] == pytest.approx(want["convergence_delta"][i], abs=1e-6)
    np.testing.assert_allclose(
        got["predictions"], outputs_of("tabular-mlp", TAB), rtol=1e-5, atol=1e-5
    )


def test_v1_explain_partition_over_a_background_with_base_values(server: Server) -> None:
    """shap users through KServe: Owen values over a background set, each explanation with
    its base value; OIP's explain carries them as an output too."""
    background = [[0.0] * 8, [0.5] * 8, [1.0, 0.0] * 4]
    params = {"method": "partition", "target": 2, "baselines": {"background": background},
              "params": {"max_evals": 40}}  # fmt: skip
    got = kserve_explain(server, "tabular-mlp", {"instances": TAB.tolist(), "parameters": params})
    want = attributions(server, "tabular-mlp", {**params, "inputs": TAB.tolist()})
    for i, e in enumerate(got["explanations"]):
        np.testing.assert_allclose(e["attributions"], want["attributions"][i], rtol=1e-6)
        assert e["base_value"] == pytest.approx(want["base_values"][i], rel=1e-6)
        assert sum(e["attributions"]) + e["base_value"] == pytest.approx(e["output"], abs=1e-5)
    # OIP takes baselines as inputs (baselines.<input>): one baseline row here
    oip_params = {k: v for k, v in params.items() if k != "baselines"}
    base = np.full((1, 8), 0.2, dtype=np.float32)
    body, headers = oip_body([("x", TAB), ("baselines.x", base)], oip_params)
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/tabular-mlp/explain", content=body, headers=headers)
    )
    one = attributions(
        server, "tabular-mlp", {**oip_params, "inputs": TAB.tolist(), "baselines": base.tolist()}
    )
    np.testing.assert_allclose(res.as_numpy("base_values"), one["base_values"], rtol=1e-6)


def test_v1_explain_defaults(server: Server) -> None:
    """No parameters: the model's default explanation at each example's predicted class."""
    r = httpx.post(f"{server.url}/v1/models/tabular-mlp:explain", json={"instances": TAB.tolist()})
    assert r.status_code == 200, r.text
    got = r.json()
    want = attributions(
        server,
        "tabular-mlp",
        {"method": "integrated_gradients", "target": "predicted", "inputs": TAB.tolist()},
    )
    assert got["method"] == "integrated_gradients"
    predicted = np.argmax(got["predictions"], axis=1).tolist()
    assert [e["target"] for e in got["explanations"]] == predicted == want["target"]
    np.testing.assert_allclose(
        [e["attributions"] for e in got["explanations"]], want["attributions"], rtol=1e-6
    )
    # token models: raw texts as instances, attributed at the embedding layer
    r = httpx.post(
        f"{server.url}/v1/models/text-classifier:explain",
        json={"instances": ["a wonderful film", "a dull boring plot"]},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "layer_integrated_gradients"
    assert [e["target"] for e in body["explanations"]] == [1, 0]
    first = body["explanations"][0]
    assert first["tokens"] == ["a", "wonderful", "film"]
    assert int(np.argmax(first["attributions"])) == 1  # "wonderful" decides it
    # models.toml explain (two-input: saliency with abs=false), instances keyed by input name
    inst = [{"a": [1.0, -2.0, 0.5], "b": [0.3, 0.1]}, {"a": [0.0, 1.0, 1.0], "b": [-1.0, 2.0]}]
    r = httpx.post(f"{server.url}/v1/models/two-input:explain", json={"instances": inst})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "saliency" and body["params"]["abs"] is False
    want = attributions(
        server,
        "two-input",
        {
            "method": "saliency",
            "params": {"abs": False},
            "target": "predicted",
            "inputs": {"a": [i["a"] for i in inst], "b": [i["b"] for i in inst]},
        },
    )
    for i, e in enumerate(body["explanations"]):
        assert len(e["attributions"]) == 2  # one per input
        np.testing.assert_allclose(e["attributions"][0], want["attributions"][0][i], rtol=1e-6)
        np.testing.assert_allclose(e["attributions"][1], want["attributions"][1][i], rtol=1e-6)


def test_v1_errors_name_the_field(server: Server) -> None:
    url = f"{server.url}/v1/models/tabular-mlp"
    cases = [
        (":predict", {"instances": [[1.0, 2.0]]}, 422, "instances"),
        (":predict", {}, 422, "instances"),
        (":explain", {"instances": TAB.tolist(), "parameters": {"method": "nope"}}, 404, "method"),
        (":explain", {"instances": TAB.tolist(), "parameters": {"inputs": []}}, 422, "inputs"),
        (":explain", {"instances": TAB.tolist(), "parameters": {"target": 7}}, 422, "target"),
        (":predict", {"instances": TAB.tolist(), "extra": 1}, 422, "extra"),
    ]
    for suffix, body, status, field in cases:
        r = httpx.post(url + suffix, json=body)
        assert r.status_code == status, (body, r.text)
        problem = r.json()
        assert r.headers["content-type"] == "application/problem+json"
        assert problem["error"] == problem["detail"]  # what KServe clients read
        assert field in str(problem["errors"]) or field in problem["detail"], problem
    # locations as the KServe body has them: instances, parameters.*
    r = httpx.post(url + ":predict", json={"instances": [[1.0, 2.0]]})
    assert r.json()["errors"][0]["loc"] == ["body", "instances"]
    assert r.json()["detail"].startswith("instances has shape [1, 2]")
    r = httpx.post(url + ":explain", json={"instances": TAB.tolist(), "parameters": {"target": 7}})
    assert r.json()["errors"][0]["loc"] == ["body", "parameters", "target"]
    r = httpx.post(
        url + ":predict", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]
    r = httpx.post(f"{server.url}/v1/models/nope:predict", json={"instances": [[1.0]]})
    assert r.status_code == 404


# -- Open Inference Protocol v2 ---------------------------------------------------------------
def triton(server: Server) -> Any:
    return http.InferenceServerClient(server.url.removeprefix("http://"))


def test_oip_metadata_and_health_with_tritonclient(server: Server) -> None:
    c = triton(server)
    assert c.is_server_live() and c.is_server_ready()
    assert c.is_model_ready("tabular-mlp") and c.is_model_ready("tabular-mlp", "1")
    meta = c.get_server_metadata()
    assert meta["name"] == "attrserve" and "binary_tensor_data" in meta["extensions"]
    model = c.get_model_metadata("image-cnn")
    assert model["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert model["outputs"][0]["shape"] == [-1, 4]
    text = c.get_model_metadata("text-classifier")
    assert text["inputs"][0]["datatype"] == "INT64" and text["inputs"][0]["shape"] == [-1, -1]
    with pytest.raises(http.InferenceServerException, match=r"404|version"):
        c.get_model_metadata("tabular-mlp", "9")
    c.close()


@pytest.mark.parametrize("binary", [True, False])
def test_oip_infer_equals_the_models_outputs(server: Server, binary: bool) -> None:
    c = triton(server)
    x = image_batch(3)
    inp = http.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = http.InferRequestedOutput("output", binary_data=binary)
    res = c.infer("image-cnn", [inp], outputs=[out], request_id="r-1")
    np.testing.assert_allclose(res.as_numpy("output"), outputs_of("image-cnn", x), atol=1e-4)
    assert res.get_response()["id"] == "r-1"
    # no outputs named: all, as binary (tritonclient's default); compressed both ways; FP64 in
    x64 = TAB.astype(np.float64)
    inp = http.InferInput("x", list(x64.shape), "FP64")
    inp.set_data_from_numpy(x64)
    res = c.infer(
        "tabular-mlp",
        [inp],
        model_version="1",
        request_compression_algorithm="gzip",
        response_compression_algorithm="gzip",
    )
    np.testing.assert_allclose(res.as_numpy("output"), outputs_of("tabular-mlp", TAB), atol=1e-5)
    c.close()


def test_oip_texts_as_bytes(server: Server) -> None:
    c = triton(server)
    texts = np.array([b"a wonderful film", b"a dull boring plot"], dtype=object)
    for binary in (True, False):
        inp = http.InferInput("ids", [2], "BYTES")
        inp.set_data_from_numpy(texts, binary_data=binary)
        res = c.infer("text-classifier", [inp])
        assert res.as_numpy("output").argmax(1).tolist() == [1, 0]
    c.close()


def oip_body(
    inputs: list[tuple[str, np.ndarray]], parameters: dict[str, Any], binary_out: bool = True
) -> tuple[bytes, dict[str, str]]:
    """An OIP request with every input as binary data, as tritonclient builds one."""
    datatypes = {np.dtype("float32"): "FP32", np.dtype("int64"): "INT64"}
    head = {
        "inputs": [
            {
                "name": name,
                "shape": list(x.shape),
                "datatype": datatypes[x.dtype],
                "parameters": {"binary_data_size": x.nbytes},
            }
            for name, x in inputs
        ],
        "parameters": {**parameters, "binary_data_output": binary_out},
    }
    header = orjson.dumps(head)
    body = header + b"".join(np.ascontiguousarray(x).tobytes() for _, x in inputs)
    return body, {"Inference-Header-Content-Length": str(len(header))}


def oip_result(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    size = r.headers.get("inference-header-content-length")
    return http.InferResult.from_response_body(r.content, header_length=size and int(size))


def test_oip_explain_equals_the_attributions_route(server: Server) -> None:
    parameters = {
        "method": "integrated_gradients",
        "target": 2,
        "params": {"n_steps": 24},
        "return_convergence_delta": True,
    }
    base = np.full((1, 8), 0.1, dtype=np.float32)
    body, headers = oip_body([("x", TAB), ("baselines.x", base)], parameters)
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/tabular-mlp/explain", content=body, headers=headers)
    )
    want = attributions(
        server, "tabular-mlp", {**parameters, "inputs": TAB.tolist(), "baselines": base.tolist()}
    )
    np.testing.assert_allclose(res.as_numpy("attributions.x"), want["attributions"], rtol=1e-6)
    np.testing.assert_allclose(res.as_numpy("outputs"), want["outputs"], rtol=1e-6)
    np.testing.assert_allclose(
        res.as_numpy("convergence_delta"), want["convergence_delta"], atol=1e-6
    )
    assert res.get_response()["parameters"]["method"] == "integrated_gradients"
    # parameters as JSON text (clients that send only scalars), JSON outputs, two inputs
    a = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
    b = np.array([[0.3, 0.1]], dtype=np.float32)
    body, headers = oip_body(
        [("a", a), ("b", b)],
        {"method": "saliency", "target": "second", "params": '{"abs": false}'},
        binary_out=False,
    )
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/two-input/explain", content=body, headers=headers)
    )
    want = attributions(
        server,
        "two-input",
        {
            "method": "saliency",
            "target": "second",
            "params": {"abs": False},
            "inputs": {"a": a.tolist(), "b": b.tolist()},
        },
    )
    np.testing.assert_allclose(res.as_numpy("attributions.a"), want["attributions"][0], rtol=1e-6)
    np.testing.assert_allclose(res.as_numpy("attributions.b"), want["attributions"][1], rtol=1e-6)


def test_oip_explain_texts_give_tokens(server: Server) -> None:
    texts = ["a wonderful film", "bad"]
    head = {
        "inputs": [{"name": "ids", "shape": [2], "datatype": "BYTES", "data": texts}],
        "parameters": {"target": "positive"},
    }
    r = httpx.post(f"{server.url}/v2/models/text-classifier/explain", json=head)
    res = oip_result(r)
    tokens = res.as_numpy("tokens")  # JSON BYTES arrive as str, binary ones as bytes
    rows = [[t.decode() if isinstance(t, bytes) else t for t in row] for row in tokens]
    assert tokens.shape == (2, 3) and rows == [["a", "wonderful", "film"], ["bad", "", ""]]
    assert res.as_numpy("attributions.ids").shape[0] == 2


def test_oip_explain_carries_units_and_superpixels(server: Server) -> None:
    """Units' offsets ([N, U, 2], -1 past a text's units) and the segments drawn (one
    ``feature_mask.<input>`` per image input), read with Triton's client."""
    texts = ["Great film. Awful end!", "Bad."]
    head = {
        "inputs": [{"name": "ids", "shape": [2], "datatype": "BYTES", "data": texts}],
        "parameters": {"method": "feature_ablation", "target": "positive", "units": "sentence"},
    }
    res = oip_result(httpx.post(f"{server.url}/v2/models/text-classifier/explain", json=head))
    offsets = res.as_numpy("units.offsets")
    assert offsets.tolist() == [[[0, 11], [12, 22]], [[0, 4], [-1, -1]]]
    want = attributions(server, "text-classifier", {**head["parameters"], "inputs": texts})
    np.testing.assert_allclose(res.as_numpy("attributions.ids"), want["attributions"], rtol=1e-6)
    image = np.random.default_rng(0).random((1, 3, 32, 32)).astype(np.float32)
    grid = {"superpixels": {"algorithm": "grid", "size": [16, 16]}}
    body, headers = oip_body([("image", image)],
                             {"method": "feature_ablation", "target": 0,
                              "params": {"feature_mask": grid}})  # fmt: skip
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/image-cnn/explain", content=body, headers=headers)
    )
    segments = res.as_numpy("feature_mask.image")
    assert segments.shape == (1, 32, 32) and segments.max() == 3 and segments[0, 0, 31] == 1


def test_oip_errors(server: Server) -> None:
    url = f"{server.url}/v2/models/tabular-mlp/infer"
    ok_input = {"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [0.0] * 8}

    def problem(r: httpx.Response, status: int) -> dict[str, Any]:
        assert r.status_code == status, r.text
        body: dict[str, Any] = r.json()
        assert body["error"] == body["detail"]
        return body

    p = problem(httpx.post(url, json={"inputs": [{**ok_input, "name": "y"}]}), 422)
    assert "unknown input 'y'" in p["error"]
    p = problem(httpx.post(url, json={"inputs": [{**ok_input, "datatype": "FP8"}]}), 422)
    assert p["errors"][0]["loc"] == ["body", "inputs", 0, "datatype"]
    p = problem(httpx.post(url, json={"inputs": [{**ok_input, "data": [0.0] * 7}]}), 422)
    assert "7 elements" in p["error"]
    p = problem(httpx.post(url, json={"inputs": [{**ok_input, "shape": [1, 4]}]}), 422)
    p = problem(httpx.post(url, json={"inputs": []}), 422)
    p = problem(httpx.post(url, json={"inputs": [ok_input], "outputs": [{"name": "z"}]}), 422)
    assert "unknown output" in p["error"]
    nan = {**ok_input, "data": [float("nan")] * 8}
    body, headers = oip_body([("x", np.full((1, 8), np.nan, dtype=np.float32))], {})
    p = problem(httpx.post(url, content=body, headers=headers), 422)
    assert "NaN" in p["error"]
    assert nan  # (JSON has no NaN literal; the binary form above carries one)
    # binary framing that does not add up
    body, headers = oip_body([("x", TAB)], {})
    p = problem(httpx.post(url, content=body[:-4], headers=headers), 422)
    assert "binary_data_size" in p["error"]
    p = problem(
        httpx.post(url, content=body, headers={"Inference-Header-Content-Length": "x"}), 400
    )
    p = problem(httpx.post(url, content=body + b"\0" * 4, headers=headers), 422)
    p = problem(httpx.post(url, content=b"not gzip", headers={"Content-Encoding": "gzip"}), 400)
    bomb = gzip.compress(b" " * (64 << 20))
    p = problem(httpx.post(url, content=bomb, headers={"Content-Encoding": "gzip"}), 413)
    assert "inflates" in p["error"]
    # BYTES in binary whose lengths run past the data
    bad = struct.pack("<I", 99) + b"abc"
    head = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "ids",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(bad)},
                }
            ]
        }
    )
    p = problem(
        httpx.post(
            f"{server.url}/v2/models/text-classifier/infer",
            content=head + bad,
            headers={"Inference-Header-Content-Length": str(len(head))},
        ),
        422,
    )
    assert "ends early" in p["error"]
    problem(httpx.post(f"{server.url}/v2/models/tabular-mlp/versions/9/infer", json={}), 404)
    problem(httpx.post(f"{server.url}/v2/models/nope/infer", json={"inputs": [ok_input]}), 404)


def test_oip_routes_keep_the_api_keys(tight_server: Server) -> None:
    url = tight_server.url
    assert httpx.get(f"{url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{url}/v2").status_code == 200
    assert httpx.get(f"{url}/").json() == {"status": "alive"}
    body = {"inputs": [{"name": "ids", "shape": [1], "datatype": "BYTES", "data": ["good"]}]}
    assert httpx.post(f"{url}/v2/models/text-classifier/infer", json=body).status_code == 401
    key = {"X-API-Key": "k-tight"}
    r = httpx.post(f"{url}/v2/models/text-classifier/infer", json=body, headers=key)
    assert r.status_code == 403 and "error" in r.json()
    assert httpx.get(f"{url}/v2/models/tabular-mlp", headers=key).status_code == 200
    r = httpx.post(f"{url}/v1/models/tabular-mlp:predict", json={"instances": TAB.tolist()})
    assert r.status_code == 401


def test_routes_without_the_fast_path() -> None:
    """The FastAPI routes (servers without the fast path) run the same handlers."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.core.settings import Settings

    app = create_app(Settings(), start_workers=False)
    app.fast_path = None
    with TestClient(app) as client:
        meta = client.get("/v2/models/tabular-mlp/versions/1").json()
        assert meta["inputs"][0]["name"] == "x"
        assert client.get("/v2/models/tabular-mlp/versions/2").status_code == 404
        bad = {"inputs": [{"name": "y", "shape": [1, 8], "datatype": "FP32", "data": [0] * 8}]}
        for path in ("/v2/models/tabular-mlp/infer", "/v2/models/tabular-mlp/versions/1/explain"):
            r = client.post(path, json=bad)
            assert r.status_code == 422 and "unknown input 'y'" in r.json()["error"]
        r = client.post("/v1/models/tabular-mlp:predict", json={"instances": [[1.0]]})
        assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "instances"]


def test_a_list_of_layers_through_kserve_and_oip(server: Server) -> None:
    """params.layer as a list (CONTRACT §7.7): KServe v1 explanations hold one entry per layer;
    OIP names each layer's tensor attributions.<layer>."""
    params = {"method": "layer_gradient_x_activation", "target": 1,
              "params": {"layer": ["fc1", "fc3"]}}  # fmt: skip
    want = attributions(server, "tabular-mlp", {**params, "inputs": TAB.tolist()})

    got = kserve_explain(server, "tabular-mlp", {"instances": TAB.tolist(), "parameters": params})
    for i, e in enumerate(got["explanations"]):
        assert len(e["attributions"]) == 2
        for k in range(2):
            np.testing.assert_allclose(e["attributions"][k], want["attributions"][k][i], rtol=1e-6)
    body, headers = oip_body([("x", TAB)], params)
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/tabular-mlp/explain", content=body, headers=headers)
    )
    for k, layer in enumerate(["fc1", "fc3"]):
        np.testing.assert_allclose(
            res.as_numpy(f"attributions.{layer}"), want["attributions"][k], rtol=1e-6
        )


def test_explain_metrics_on_both_protocols(server: Server) -> None:
    """``metrics`` as an explain parameter: KServe gives each explanation its scores, OIP
    outputs ``metrics.<name>`` (``.auc``, ``.curve`` for the curves), as the attributions
    route computes them."""
    params = {
        "method": "integrated_gradients",
        "target": 1,
        "params": {"n_steps": 16},
        "metrics": {"infidelity": {}, "deletion": {"steps": 5}},
    }
    want = attributions(server, "tabular-mlp", {**params, "inputs": TAB.tolist()})["metrics"]

    got = kserve_explain(server, "tabular-mlp", {"instances": TAB.tolist(), "parameters": params})
    for i, e in enumerate(got["explanations"]):
        assert e["metrics"]["infidelity"] == pytest.approx(want["infidelity"][i], rel=1e-6)
        assert e["metrics"]["deletion"]["auc"] == pytest.approx(want["deletion"]["auc"][i])
        assert e["metrics"]["deletion"]["curve"] == pytest.approx(want["deletion"]["curve"][i])
    # OIP: parameters are scalars (tritonclient's rule), so the metrics go as JSON text
    text = orjson.dumps(params["metrics"]).decode()
    body, headers = oip_body([("x", TAB)], {**params, "metrics": text})
    res = oip_result(
        httpx.post(f"{server.url}/v2/models/tabular-mlp/explain", content=body, headers=headers)
    )
    np.testing.assert_allclose(res.as_numpy("metrics.infidelity"), want["infidelity"], rtol=1e-6)
    np.testing.assert_allclose(res.as_numpy("metrics.deletion.auc"), want["deletion"]["auc"])
    np.testing.assert_allclose(res.as_numpy("metrics.deletion.curve"), want["deletion"]["curve"])
