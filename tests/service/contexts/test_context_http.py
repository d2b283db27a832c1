"""``POST /v1/models/{id}/context-attributions`` on the main server's "gpt2-dir" (the float64
GPT-2 of tests/methods/test_generation.py with a chat template): the engine's numbers, a
generated answer, the limits and the mistakes, each a 422 naming its field."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import methods
from tests.methods.test_generation import gpt2, tiny_lm
from tests.methods.test_generation_chat import chat_tokenizer
from tests.service.conftest import Server

CONTEXT = "alice lives in paris. bob lives in rome. carol is old."
QUERY = "who lives in paris"
ANSWER = "alice lives in paris. bob is old."


def post(server: Server, model: str, body: dict[str, Any]) -> Any:
    with server.client() as c:
        return c.post(f"/v1/models/{model}/context-attributions", json=body)


def test_the_engine_s_numbers_over_http(server: Server) -> None:
    body = {"context": CONTEXT, "query": QUERY, "answer": ANSWER, "n_ablations": 24, "seed": 3,
            "return_masks": True}  # fmt: skip
    r = post(server, "gpt2-dir", body)
    assert r.status_code == 200, r.text
    got = r.json()
    want = methods.attribute_context(
        gpt2(), chat_tokenizer(), CONTEXT, QUERY, ANSWER, n_ablations=24, seed=3
    )
    assert (
        got["units"]
        == want.units
        == ["alice lives in paris.", "bob lives in rome.", "carol is old."]
    )
    assert got["answer_sentences"] == want.answer_sentences
    assert got["answer_spans"] == [list(span) for span in want.answer_spans]
    torch.testing.assert_close(torch.tensor(got["scores"], dtype=torch.float64), want.scores)
    assert got["top"] == want.top
    assert got["fit"]["r2"] == pytest.approx(want.fit["r2"])
    assert got["masks"] == want.masks.to(int).tolist()
    assert got["params"]["chat_template"] is True and got["params"]["n_ablations"] == 24
    assert got["stats"]["prompts"] >= 1 and set(got["timing_ms"]) >= {"queue", "compute"}


def test_a_given_answer_comes_back_as_given(server: Server) -> None:
    """CONTRACT 9.1, on tiny-lm, whose tokenizer lowercases and decodes words spaced apart: the
    answer as given, its sentences substrings of it at answer_spans, the engine's numbers."""
    answer = "Alice lives in Paris. Bob is old!"
    context = "Alice lives in Paris. Bob lives in Rome."
    body = {"context": context, "query": "Where?", "answer": answer, "n_ablations": 8}
    r = post(server, "tiny-lm", body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["answer"] == answer
    assert got["answer_sentences"] == ["Alice lives in Paris.", "Bob is old!"]
    assert got["answer_spans"] == [[0, 21], [22, 33]]
    model, tok = tiny_lm()
    want = methods.attribute_context(model, tok, context, "Where?", answer, n_ablations=8)
    torch.testing.assert_close(torch.tensor(got["scores"], dtype=torch.float64), want.scores)


def test_a_generated_answer_and_documents(server: Server) -> None:
    docs = ["alice lives in paris.", "bob lives in rome."]
    r = post(server, "gpt2-dir", {"context": docs, "query": QUERY, "units": "documents",
                                  "gen_args": {"max_new_tokens": 3}})  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["units"] == docs and got["masks"] is None
    assert len(got["scores"]) == len(got["answer_sentences"]) >= 1
    assert [got["answer"][a:b] for a, b in got["answer_spans"]] == got["answer_sentences"]
    assert all(len(row) == 2 for row in got["scores"])
    assert got["params"]["gen_args"]["max_new_tokens"] == 3


@pytest.mark.parametrize(
    "model, body, status, loc",
    [
        ("tabular-mlp", {}, 422, ["path", "model_id"]),
        ("gpt2-dir", {"context": "  "}, 422, ["body", "context"]),
        ("gpt2-dir", {"prompt_template": "{context} only"}, 422, ["body", "prompt_template"]),
        ("gpt2-dir", {"n_ablations": 4}, 422, ["body", "n_ablations"]),
        ("gpt2-dir", {"n_ablations": 100000}, 422, ["body", "n_ablations"]),
        ("gpt2-dir", {"units": "words"}, 422, ["body", "units"]),
        ("gpt2-dir", {"unit_pattern": "("}, 422, ["body", "unit_pattern"]),
        ("gpt2-dir", {"gen_args": {"max_new_tokens": 2}}, 422, ["body", "gen_args"]),
        ("gpt2-dir", {"answer": " "}, 422, ["body", "answer"]),
        ("gpt2-dir", {"context": "alice lives in paris. " * 20}, 422, ["body", "context"]),
        ("gpt2-dir", {"keep_prob": 1}, 422, ["body", "keep_prob"]),
        ("gpt2-dir", {"n_ablation": 8}, 422, ["body", "n_ablation"]),
    ],
)
def test_mistakes_name_their_field(
    server: Server, model: str, body: dict[str, Any], status: int, loc: list[Any]
) -> None:
    r = post(server, model, {"context": CONTEXT, "query": QUERY, "answer": ANSWER, **body})
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"][0]["loc"] == loc, r.text


def test_an_unknown_model_is_404(server: Server) -> None:
    r = post(server, "nope", {"context": CONTEXT, "query": QUERY})
    assert r.status_code == 404
