"""Causal language models over HTTP: tiny-lm (built-in) and a Hugging Face directory (hf:),
through POST /v1/models/{id}/attributions; the engine's numbers, the ground truth, typed 422s."""

from __future__ import annotations

import base64
import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch

import methods
import model_registry
from methods.engine import precision as precision_
from model_registry.builtin import lm as tiny
from service.core.settings import Settings
from service.kinds.causal_lm import CausalLMKind
from service.wire.attributions import AttributionRequest
from tests.methods.test_generation import gpt2, gpt2_tokenizer
from tests.service.conftest import Server


@pytest.fixture(scope="module")
def lm_server(server: Server) -> Server:
    """The main server (tests/service/conftest.py), which serves tiny-lm and "gpt2-dir" (the
    float64 GPT-2 of tests/methods/test_generation.py saved as a directory), targets capped
    at 6 tokens, HF_HUB_OFFLINE=1."""
    return server


def post(server: Server, model: str, body: dict[str, Any]) -> Any:
    with server.client() as c:
        return c.post(f"/v1/models/{model}/attributions", json=body)


def test_model_info_describes_a_causal_lm(lm_server: Server) -> None:
    with lm_server.client() as c:
        info = c.get("/v1/models/tiny-lm").json()
    assert info["kind"] == "causal_lm"
    assert "feature_ablation" in info["methods"] and "layer_integrated_gradients" in info["methods"]
    assert "occlusion" not in info["methods"]


def test_tiny_lm_ground_truth_over_http(lm_server: Server) -> None:
    r = post(lm_server, "tiny-lm", {
        "method": "shapley_values",
        "inputs": {"prompt": "{} {} lives in", "features": ["my old friend", "grace"]},
        "target": None, "params": {"gen_args": {"max_new_tokens": 2}},
    })  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["input_tokens"] == ["my old friend", "grace"]
    assert body["output_tokens"][0] == tiny.CITIES[tiny.FACTS[tiny.NAMES.index("grace")]]
    assert body["seq_attr"][1] > 5 * abs(body["seq_attr"][0])
    assert len(body["token_attr"]) == len(body["output_tokens"])
    assert body["attributions"] == [pytest.approx(body["seq_attr"], rel=1e-6)]
    f = body["fidelity"]  # every answer says what its numbers were computed in
    assert f["precision"] == "float32" and f["delta_ratio"] is None and not f["checked"]


def test_a_generated_answer_stops_at_the_servers_target_limit(lm_server: Server) -> None:
    """No gen_args on a server whose targets are capped at 6 tokens: the answer is generated
    up to the cap (it was refused: the default length is over it)."""
    body = {"method": "feature_ablation", "inputs": {"prompt": "alice lives in"}, "target": None}
    r = post(lm_server, "tiny-lm", body)
    assert r.status_code == 200, r.text
    assert 1 <= len(r.json()["output_tokens"]) <= 6


def test_every_listed_method_serves_tiny_lm(lm_server: Server) -> None:
    """Each method ModelInfo lists answers over HTTP (the layer methods used to be refused with
    and without a layer: attribute_generation sets it to the token embedding)."""
    with lm_server.client() as c:
        listed = c.get("/v1/models/tiny-lm").json()["methods"]
    prompt = {"prompt": "grace lives in"}  # every token a feature: gradient methods too
    for method in listed:
        r = post(lm_server, "tiny-lm", {"method": method, "inputs": prompt, "target": " paris"})
        assert r.status_code == 200, (method, r.text)
        assert len(r.json()["seq_attr"]) == len(r.json()["input_tokens"]) >= 3
    layer = {"method": "layer_integrated_gradients", "inputs": prompt, "target": " paris"}
    r = post(lm_server, "tiny-lm", {**layer, "params": {"layer": "lm.embed"}})
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == ["body", "params", "layer"]


def test_http_equals_the_engine_on_a_hugging_face_directory(lm_server: Server) -> None:
    body = {
        "method": "feature_ablation",
        "inputs": {"prompt": "my friend {} lives in {}", "features": ["alice", "the city"],
                   "baselines": ["bob", ""]},
        "target": "paris rome",
    }  # fmt: skip
    r = post(lm_server, "gpt2-dir", body)
    assert r.status_code == 200, r.text
    got = r.json()
    want = methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), "my friend {} lives in {}", features=["alice", "the city"],
        baselines=["bob", ""], target="paris rome",
    )  # fmt: skip
    torch.testing.assert_close(torch.tensor(got["seq_attr"], dtype=torch.float64), want.seq_attr)
    torch.testing.assert_close(
        torch.tensor(got["token_attr"], dtype=torch.float64), want.token_attr
    )
    assert got["output_tokens"] == ["paris", "rome"]


def test_step_scores_names_the_scores_the_answer_carries(lm_server: Server) -> None:
    """params.step_scores (CONTRACT 8.3): only the listed per-step scores, equal to the
    engine's; a wrong name is a 422 at the field."""
    body = {"method": "feature_ablation", "inputs": {"prompt": "my friend alice lives in the city"},
            "target": "paris rome", "params": {"step_scores": ["rank", "entropy"]}}  # fmt: skip
    r = post(lm_server, "gpt2-dir", body)
    assert r.status_code == 200, r.text
    want = methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), "my friend alice lives in the city", "feature_ablation",
        target="paris rome", step_scores=["rank", "entropy"],
    )  # fmt: skip
    assert set(want.step_scores) == {"rank", "entropy"}
    got = r.json()["step_scores"]
    assert set(got) == {"rank", "entropy"} and got["rank"] == want.step_scores["rank"]
    assert got["entropy"] == pytest.approx(want.step_scores["entropy"])
    assert "step_scores" not in r.json()["params"]
    bad = {**body, "params": {"step_scores": ["probability", "surprise"]}}
    r = post(lm_server, "gpt2-dir", bad)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"] == ["body", "params", "step_scores"]


@pytest.mark.parametrize(
    "objective",
    [
        {"target_fn": "prob"},
        {"target_fn": "contrast", "contrast_target": "oslo lima", "contrast_fn": "logit"},
    ],
    ids=["prob", "contrast"],
)
def test_what_is_attributed_is_a_param_of_every_generation_method(
    lm_server: Server, objective: dict[str, Any]
) -> None:
    """params.target_fn (and a contrast answer) over HTTP equal the engine's, with the answer's
    score table; mistakes name the field."""
    for method in ("feature_ablation", "input_x_gradient"):
        body = {"method": method, "inputs": {"prompt": "my friend alice lives in the city"},
                "target": "paris rome", "params": objective}  # fmt: skip
        r = post(lm_server, "gpt2-dir", body)
        assert r.status_code == 200, r.text
        got = r.json()
        want = methods.attribute_generation(
            gpt2(), gpt2_tokenizer(), "my friend alice lives in the city", method,
            target="paris rome", **objective,
        )  # fmt: skip
        torch.testing.assert_close(
            torch.tensor(got["token_attr"], dtype=torch.float64), want.token_attr
        )
        assert got["params"]["target_fn"] == objective["target_fn"]
        assert got["outputs"] == pytest.approx([float(want.output_scores.sum())])
        assert set(got["step_scores"]) == {"probability", "log_prob", "entropy", "rank"}
        assert got["step_scores"]["probability"] == pytest.approx(want.step_scores["probability"])
    bad = {"method": "feature_ablation", "inputs": {"prompt": "my friend alice"},
           "target": "paris", "params": {"target_fn": "contrast"}}  # fmt: skip
    r = post(lm_server, "gpt2-dir", bad)
    assert r.status_code == 422 and r.json()["errors"][0]["loc"] == [
        "body", "params", "contrast_target"
    ]  # fmt: skip
    r = post(
        lm_server,
        "gpt2-dir",
        {**bad, "params": {"target_fn": "contrast", "contrast_target": "oslo lima"}},
    )
    # a contrast of another length pairs from the end, as inseq pairs: "paris" with "lima"
    assert r.status_code == 200, r.text
    assert r.json()["params"]["contrast_ids"] == gpt2_tokenizer().convert_tokens_to_ids(["lima"])


def test_a_conversation_through_the_chat_template(lm_server: Server) -> None:
    """inputs.messages on a directory whose tokenizer has a chat template: each turn (or
    sentence) a feature, equal to the engine's; a model without one, and malformed messages,
    are 422s naming inputs.messages."""
    from tests.methods.test_generation_chat import MESSAGES, chat_tokenizer

    for features in ("turns", "sentences"):
        body = {"method": "feature_ablation", "target": "paris",
                "inputs": {"messages": MESSAGES, "features": features}}  # fmt: skip
        r = post(lm_server, "gpt2-dir", body)
        assert r.status_code == 200, r.text
        want = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris",
                                            features=features)  # fmt: skip
        assert r.json()["input_tokens"] == want.input_tokens
        torch.testing.assert_close(
            torch.tensor(r.json()["seq_attr"], dtype=torch.float64), want.seq_attr
        )
    for model, inputs in [
        ("tiny-lm", {"messages": MESSAGES}),
        ("gpt2-dir", {"messages": [{"role": "user"}]}),
        ("gpt2-dir", {"messages": MESSAGES, "prompt": "both"}),
    ]:
        r = post(lm_server, model, {"method": "feature_ablation", "target": "paris",
                                    "inputs": inputs})  # fmt: skip
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0]["loc"][:2] == ["body", "inputs"], r.text
    r = post(lm_server, "tiny-lm", {"method": "feature_ablation", "target": "paris",
                                    "inputs": {"messages": MESSAGES}})  # fmt: skip
    assert r.json()["errors"][0]["loc"] == ["body", "inputs", "messages"]
    assert "chat template" in r.text


def test_gradient_method_on_tokens_over_http(lm_server: Server) -> None:
    r = post(lm_server, "tiny-lm", {
        "method": "saliency",
        "inputs": {"prompt": "my old friend grace lives in", "skip_tokens": ["<bos>"]},
        "target": "cairo",
    })  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "layer_gradient_x_activation"
    assert body["requested_method"] == "saliency"
    assert len(body["seq_attr"]) == 6 and min(body["seq_attr"]) >= 0


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"inputs": {"prompt": ""}}, ["body", "inputs", "prompt"]),
        ({"inputs": {"prompt": "{} lives in {}", "features": ["alice"]}},
         ["body", "inputs", "features"]),
        ({"inputs": {"prompt": "{} lives in", "features": ["alice"], "baselines": ["a", "b"]}},
         ["body", "inputs", "baselines"]),
        ({"target": "paris rome oslo lima paris rome oslo"}, ["body", "target"]),
        ({"inputs": {"prompt": "alice lives in", "colour": 1}}, ["body", "inputs", "colour"]),
        ({"inputs": [[1, 2, 3]]}, ["body", "inputs"]),
        ({"method": "occlusion"}, ["body", "method"]),
        ({"inputs": {"prompt": "{} lives in", "features": ["alice"]}, "method": "saliency"},
         ["body", "method"]),
        ({"baselines": 0}, ["body", "baselines"]),
        ({"params": {"gen_args": {"max_new_tokens": 3}}}, ["body", "params", "gen_args"]),
        ({"params": {"n_samples": 4}}, ["body", "params", "n_samples"]),
        ({"method": "shapley_values", "inputs": {"prompt": " ".join(["{}"] * 30),
          "features": ["alice"] * 30}}, ["body"]),
    ],
)  # fmt: skip
def test_bad_requests_are_typed_422s(
    lm_server: Server, body: dict[str, Any], loc: list[Any]
) -> None:
    full = {"method": "feature_ablation", "inputs": {"prompt": "alice lives in"}, "target": "rome"}
    r = post(lm_server, "tiny-lm", {**full, **body})
    assert r.status_code == 422, r.text
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["errors"][0]["loc"] == loc, problem


def test_tensor_routes_refuse_a_causal_lm(lm_server: Server) -> None:
    with lm_server.client() as c:
        r = c.post("/v1/models/tiny-lm:predict", json={"instances": [[1, 2, 3]]})
    assert r.status_code == 422, r.text


def test_hf_directory_loads_with_the_engine(tmp_path: Path) -> None:
    gpt2().save_pretrained(tmp_path / "m")
    gpt2_tokenizer().save_pretrained(tmp_path / "m")
    (tmp_path / "models.toml").write_text('[[models]]\nid = "m"\nsource = "hf:m"\n')
    (spec,) = model_registry.load_specs(tmp_path / "models.toml")
    assert spec.task == "causal_lm"
    loaded = model_registry.load(spec)
    res = methods.attribute_generation(
        loaded.model, loaded.text_tokenizer, "alice lives in", target="paris"
    )
    assert res.seq_attr.shape == (4,)


def test_render_highlights_the_prompt_features(lm_server: Server) -> None:
    body = {
        "method": "feature_ablation",
        "inputs": {"prompt": "{} {} lives in", "features": ["my old friend", "grace"]},
        "target": "cairo",
        "render": {"format": "html", "sign": "all"},
    }
    r = post(lm_server, "tiny-lm", body)
    assert r.status_code == 200, r.text
    (pic,) = r.json()["renders"]
    assert pic["media_type"] == "text/html"
    html = base64.b64decode(pic["b64"]).decode()
    assert "grace" in html and "my old friend" in html
    with lm_server.client() as c:
        png = c.post("/v1/models/tiny-lm/attributions", json=body, headers={"accept": "image/png"})
    assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def test_a_cancelled_generation_stops_and_leaves_its_worker_idle(lm_server: Server) -> None:
    """Sampling over a generative LM past its deadline: 504 at the deadline, and the worker
    (not restarted) answers the next request at once: the loop stopped between evaluations."""
    with lm_server.client() as c:
        (before,) = [(w["pid"], w["restarts"]) for w in c.get("/v1/health/ready").json()["workers"]
                     if w["group"] == "gpt2-dir"]  # fmt: skip
        words = ["alice", "the city", "bob", "a friend", "paris", "rome", "old", "new"] * 4
        expensive = {
            "method": "shapley_value_sampling",
            "inputs": {"prompt": " ".join(["{}"] * len(words)), "features": words},
            "target": "paris rome", "deadline_ms": 300,
            "params": {"n_samples": 600}, "perturbations_per_eval": 1,
        }  # fmt: skip
        t0 = time.monotonic()
        r = c.post("/v1/models/gpt2-dir/attributions", json=expensive)
        assert r.status_code == 504, r.text
        assert time.monotonic() - t0 < 10.0
        cheap = {"method": "feature_ablation", "target": "paris",
                 "inputs": {"prompt": "{} lives in", "features": ["alice"]}}  # fmt: skip
        t0 = time.monotonic()
        r = c.post("/v1/models/gpt2-dir/attributions", json=cheap)
        assert r.status_code == 200, r.text
        # not behind the abandoned sampling (19,800 single-row forwards); generous
        # for a loaded CI machine, where one cheap request alone has taken 2 s
        assert time.monotonic() - t0 < 15.0
        (after,) = [(w["pid"], w["restarts"]) for w in c.get("/v1/health/ready").json()["workers"]
                    if w["group"] == "gpt2-dir"]  # fmt: skip
        assert after == before


def test_an_encoder_decoder_directory_is_served_as_seq2seq_lm(lm_server: Server) -> None:
    """hf: with a *ForConditionalGeneration config: kind seq2seq_lm, the prompt its source;
    the engine's numbers; context attributions too; no stream (an answer comes whole)."""
    from tests.methods.test_generation_seq2seq import seq2seq

    with lm_server.client() as c:
        info = c.get("/v1/models/bart-dir").json()
        assert info["kind"] == "seq2seq_lm" and "input_x_gradient" in info["methods"]
        body = {"method": "input_x_gradient", "inputs": {"prompt": "my friend alice lives in"},
                "target": "paris rome"}  # fmt: skip
        r = c.post("/v1/models/bart-dir/attributions", json=body)
        assert r.status_code == 200, r.text
        r_whole = r.json()
        want = methods.attribute_generation(
            seq2seq("bart"), gpt2_tokenizer(), "my friend alice lives in", "input_x_gradient",
            target="paris rome",
        )  # fmt: skip
        torch.testing.assert_close(
            torch.tensor(r.json()["token_attr"], dtype=torch.float64), want.token_attr
        )
        # streamed as a causal LM's answer is (CONTRACT 8.3): a row per answer token, then
        # the whole body
        r = c.post("/v1/models/bart-dir/attributions", json=body,
                   headers={"Accept": "text/event-stream"})  # fmt: skip
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        got = [(e.split("\n")[0][7:], orjson.loads(e.split("\n")[1][6:]))
               for e in r.text.strip().split("\n\n")]  # fmt: skip
        assert [n for n, _ in got] == ["token", "token", "result"]
        torch.testing.assert_close(
            torch.tensor([d["attr"] for _, d in got[:2]], dtype=torch.float64), want.token_attr
        )
        np.testing.assert_allclose(got[2][1]["token_attr"], r_whole["token_attr"], rtol=1e-9)
        r = c.post("/v1/models/bart-dir/context-attributions", json={
            "context": "alice lives in paris. bob lives in rome.", "query": "who lives in paris",
            "answer": "alice lives in paris.", "n_ablations": 8})  # fmt: skip
        assert r.status_code == 200, r.text
        assert len(r.json()["scores"][0]) == 2


def test_a_precision_over_http_is_the_engines_and_says_what_it_cost(lm_server: Server) -> None:
    """gpt2-dir is served in float64: float32 asked for runs its cast copy; verify compares
    with its float32 computation, a failed check answers in float32 (here: float32 itself)."""
    body = {
        "method": "layer_integrated_gradients",
        "inputs": {"prompt": "my friend alice lives in the city", "baselines": "<unk>"},
        "target": "paris rome", "precision": "float32", "verify": True,
    }  # fmt: skip
    r = post(lm_server, "gpt2-dir", body)
    assert r.status_code == 200, r.text
    got = r.json()
    f = got["fidelity"]
    assert f["precision"] == "float32" and f["checked"] and not f["fallback"]
    assert f["rel_l2"] == 0.0 and f["delta_ratio"] is None
    want = methods.attribute_generation(
        gpt2(), gpt2_tokenizer(), "my friend alice lives in the city",
        "layer_integrated_gradients", target="paris rome", baselines="<unk>",
    )  # fmt: skip
    seq = torch.tensor(got["seq_attr"], dtype=torch.float64)
    assert 0 < float((seq - want.seq_attr).norm() / want.seq_attr.norm()) < 1e-5
    low = post(lm_server, "gpt2-dir", {**body, "precision": "bfloat16"})
    assert low.status_code == 200, low.text
    fl = low.json()["fidelity"]
    assert fl["checked"] and fl["rel_l2"] is not None and fl["topk_agreement"] is not None
    assert fl["precision"] == ("float32" if fl["fallback"] else "bfloat16")


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"verify": True}, {}),  # nothing to check: the model's own dtype
        ({"precision": "bfloat16", "verify": True}, {"Accept": "text/event-stream"}),
        ({"precision": "int8"}, {}),
    ],
    ids=["verify-own-dtype", "verify-stream", "unknown"],
)
def test_precision_mistakes_are_typed_422s(
    lm_server: Server, body: dict[str, Any], headers: dict[str, str]
) -> None:
    full = {"method": "feature_ablation", "inputs": {"prompt": "alice lives in"}, "target": "rome"}
    with lm_server.client() as c:
        r = c.post("/v1/models/gpt2-dir/attributions", json={**full, **body}, headers=headers)
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"][:2] in (["body", "verify"], ["body", "precision"])


def test_a_stream_in_a_precision_says_so(lm_server: Server) -> None:
    body = {"method": "feature_ablation", "inputs": {"prompt": "my friend alice lives in"},
            "target": "paris rome", "precision": "float32"}  # fmt: skip
    with lm_server.client() as c:
        whole = c.post("/v1/models/gpt2-dir/attributions", json=body).json()
        with c.stream("POST", "/v1/models/gpt2-dir/attributions", json=body,
                      headers={"Accept": "text/event-stream"}) as r:  # fmt: skip
            assert r.status_code == 200
            text = "".join(r.iter_text())
    result = orjson.loads(text.split("event: result\ndata: ")[1].split("\n\n")[0])
    assert result["fidelity"]["precision"] == "float32" and not result["fidelity"]["checked"]
    # float32 both, batched differently: equal to float32's rounding
    np.testing.assert_allclose(result["seq_attr"], whole["seq_attr"], rtol=1e-4, atol=1e-5)


def test_precision_auto_probes_a_language_model_at_load() -> None:
    """models.toml ``precision = "auto"`` on a causal LM: the worker's prepare probes feature
    ablation on a short prompt; GET /v1/models/{id} shows what it kept."""
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tiny-lm"]
    lm = model_registry.load(dataclasses.replace(spec, precision="auto"))
    info = CausalLMKind().prepare(lm)["precision"]
    assert info["default"] == "auto" and str(info["chosen"]).startswith("kept ")
    kept = precision_.known_probe(lm.model, ("generation", "feature_ablation"))
    assert kept is not None and set(info["probe"]) == set(kept.relative_l2)


def test_a_share_of_low_precision_answers_is_checked_unasked() -> None:
    """models.toml fidelity_sample = 1 on a causal LM: every low-precision answer is checked;
    at its own dtype there is nothing to check."""
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == "tiny-lm"]
    spec = dataclasses.replace(spec, precision="bfloat16", fidelity_sample=1.0)
    body = {"method": "feature_ablation", "inputs": {"prompt": "alice lives in"}, "target": "rome"}
    job = CausalLMKind().build_work(Settings(), spec, AttributionRequest(**body), time.time() + 60)
    assert (job.precision, job.verify) == ("bfloat16", True)
    own = AttributionRequest(**body, precision="float32")
    job = CausalLMKind().build_work(Settings(), spec, own, time.time() + 60)
    assert (job.precision, job.verify) == (None, False)


def test_an_encoder_decoder_answers_in_a_precision(lm_server: Server) -> None:
    """bart-dir (float64): float32 asked for runs its cast copy, checked against float32."""
    body = {"method": "saliency", "inputs": {"prompt": "my friend alice lives in the city"},
            "target": "paris rome", "precision": "float32", "verify": True}  # fmt: skip
    r = post(lm_server, "bart-dir", body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["fidelity"]["precision"] == "float32" and got["fidelity"]["checked"]
    plain = post(lm_server, "bart-dir", {**body, "precision": None, "verify": False}).json()
    assert plain["fidelity"]["precision"] == "float64"
    np.testing.assert_allclose(got["seq_attr"], plain["seq_attr"], rtol=1e-4, atol=1e-7)
