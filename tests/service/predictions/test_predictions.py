"""``POST /v1/models/{id}/predictions`` (CONTRACT §9.6): every example's prediction, and
attributions only where ``explain_if`` (JMESPath, as Clarify's EnableExplanations) holds, each
equal to the attributions route's for that example; bad conditions refused by name."""

from __future__ import annotations

from typing import Any

import httpx
import jmespath
import numpy as np
import pytest

from tests.service.conftest import Server

ROWS = np.random.default_rng(1).normal(size=(40, 8)).round(3).tolist()


def post(server: Server, model: str, route: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/{route}", json=body, timeout=60)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_only_the_predictions_that_meet_the_condition_are_explained(server: Server) -> None:
    condition = "probability < `0.9` && label != 'low'"
    body = {"inputs": ROWS, "explain_if": condition, "method": "integrated_gradients",
            "params": {"n_steps": 16}}  # fmt: skip
    r = post(server, "tabular-mlp", "predictions", body)
    assert r.status_code == 200, r.text
    got = r.json()
    predicted = httpx.post(f"{server.url}/v1/models/tabular-mlp:predict",
                           json={"instances": ROWS}, timeout=60)  # fmt: skip
    logits = np.array(predicted.json()["predictions"])
    probs = softmax(logits)
    labels = ["low", "mid", "high"]
    chosen = []
    for i, p in enumerate(got["predictions"]):
        c = int(logits[i].argmax())
        assert p["class"] == c and p["label"] == labels[c]
        assert p["probability"] == pytest.approx(probs[i, c], rel=1e-5)
        np.testing.assert_allclose(p["output"], logits[i], rtol=1e-6)
        if jmespath.search(condition, p):
            chosen.append(i)
    assert 0 < len(chosen) < len(ROWS)  # the condition chose some, not all
    assert got["explained"] == len(chosen) and got["method"] == "integrated_gradients"
    assert [i for i, e in enumerate(got["explanations"]) if e is not None] == chosen
    alone = post(server, "tabular-mlp", "attributions",
                 {"method": "integrated_gradients", "inputs": [ROWS[i] for i in chosen],
                  "target": "predicted", "params": {"n_steps": 16}}).json()  # fmt: skip
    for j, i in enumerate(chosen):
        e = got["explanations"][i]
        assert e["target"] == alone["target"][j]
        np.testing.assert_allclose(e["attributions"], alone["attributions"][j], rtol=1e-5)


def test_without_a_condition_nothing_is_explained_and_the_method_defaults(server: Server) -> None:
    none = post(server, "tabular-mlp", "predictions", {"inputs": ROWS[:3]}).json()
    assert none["explained"] == 0 and none["explanations"] == [None] * 3
    assert none["method"] is None and len(none["predictions"]) == 3
    every = post(server, "tabular-mlp", "predictions",
                 {"inputs": ROWS[:3], "explain_if": "`true`"}).json()  # fmt: skip
    assert every["explained"] == 3
    assert every["method"] == "integrated_gradients"  # its default explanation (KServe's too)


def test_texts_are_explained_with_their_tokens(server: Server) -> None:
    texts = ["a great film", "an awful film", "an awful plot"]
    body = {"inputs": texts, "explain_if": "label == 'negative'", "method": "feature_ablation"}
    got = post(server, "text-classifier", "predictions", body).json()
    assert [p["label"] for p in got["predictions"]] == ["positive", "negative", "negative"]
    asked = {"method": "feature_ablation", "inputs": texts[1:], "target": "predicted"}
    alone = post(server, "text-classifier", "attributions", asked).json()
    assert got["explanations"][0] is None
    for j, e in enumerate(got["explanations"][1:]):
        assert e["tokens"] == alone["tokens"][j]
        n = len(e["tokens"])
        np.testing.assert_allclose(e["attributions"][:n], alone["attributions"][j][:n], rtol=1e-6)


@pytest.mark.parametrize(
    ("model", "body", "loc", "words"),
    [
        ("tabular-mlp", {"explain_if": "probability <"}, ["body", "explain_if"], ["JMESPath"]),
        ("tabular-mlp", {"explain_if": "abs(label)"}, ["body", "explain_if"], ["evaluated"]),
        ("tabular-mlp", {"explain_if": "`true`", "render": {}}, ["body", "render"], ["pictures"]),
        ("tabular-mlp", {"explain_if": "`true`", "method": "no_such"}, ["body", "method"],
         ["unknown method"]),
        ("tiny-lm", {"explain_if": "`true`"}, ["path", "model_id"], ["classifiers"]),
    ],
)  # fmt: skip
def test_bad_requests_name_the_field(
    server: Server, model: str, body: dict[str, Any], loc: list[str], words: list[str]
) -> None:
    inputs = ["hello"] if model == "tiny-lm" else ROWS[:2]
    r = post(server, model, "predictions", {"inputs": inputs, **body})
    assert r.status_code in (404, 422), r.text
    problem = r.json()
    assert problem["errors"][0]["loc"] == loc, problem
    for w in words:
        assert w in problem["detail"], problem["detail"]
