"""Hugging Face sequence classifiers by directory (``source = "hf:DIR"``, CONTRACT §7.5):
single texts and text pairs over HTTP with Captum's numbers (LayerIntegratedGradients on the
word embeddings, the tokenizer's mask and token types beside it), labels from the config, and
directories that cannot be served refused with the model, the field and the problem."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

import model_registry
from model_registry.errors import RegistryError
from tests.hf_dirs import LABELS, NER_LABELS, WORDS, bert_dir, ner_dir
from tests.service.conftest import Server, start_server, stop_server

TEXTS = ["the film was great", "a dull plot and bad acting"]
PAIRS = [["the film was great", "not very good"], ["a dull story", "the acting was bad"]]


def captum_lig(path: Path, text: Any, target: Any) -> tuple[np.ndarray, list[str]]:
    """Captum's LayerIntegratedGradients on the word embeddings (float64), one example: the
    tokenizer's mask and token types as additional arguments, the baseline the special tokens
    kept and [PAD] elsewhere; per token, summed over the embedding."""
    from captum.attr import LayerIntegratedGradients
    from transformers import (
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
        AutoTokenizer,
    )

    per_token = isinstance(target, tuple)
    auto = AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification
    model = auto.from_pretrained(path).double().eval()
    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(*([text] if isinstance(text, str) else text), return_tensors="pt",
              return_special_tokens_mask=True)  # fmt: skip
    ids = enc["input_ids"]
    base = torch.where(enc["special_tokens_mask"].bool(), ids, torch.full_like(ids, 0))

    def forward(ids: torch.Tensor, mask: torch.Tensor, *types: torch.Tensor) -> torch.Tensor:
        kw = {"token_type_ids": types[0]} if types else {}
        return model(input_ids=ids, attention_mask=mask, **kw).logits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lig = LayerIntegratedGradients(forward, model.get_input_embeddings())
        args = (enc["attention_mask"], *([enc["token_type_ids"]] if not per_token else []))
        attr = lig.attribute(
            ids, baselines=base, target=target, n_steps=50, additional_forward_args=args
        )
    return attr.sum(-1)[0].detach().numpy(), tok.convert_ids_to_tokens(ids[0])


@pytest.fixture(scope="module")
def hf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    tmp = tmp_path_factory.mktemp("hf")
    path = bert_dir(tmp / "bert")
    ner_dir(tmp / "ner")
    toml = (
        '[[models]]\nid = "bert"\nsource = "hf:bert"\ndtype = "float64"\n\n'
        '[[models]]\nid = "ner"\nsource = "hf:ner"\ndtype = "float64"\n\n'
        '[[models]]\nid = "text-classifier"\nsource = "builtin:text-classifier"\n'
    )
    server = start_server(tmp, toml=toml, workers=1)  # HF_HUB_OFFLINE unset: never needed
    yield server, path
    stop_server(server)


def post(server: Server, body: dict[str, Any], model: str = "bert") -> httpx.Response:
    return httpx.post(f"{server.url}/v1/models/{model}/attributions", json=body, timeout=60)


def test_the_directory_describes_the_model(hf_server: tuple[Server, Path]) -> None:
    server, _ = hf_server
    info = httpx.get(f"{server.url}/v1/models/bert").json()
    assert info["kind"] == "text_classification"  # CONTRACT 7.5: the task, not "tensor"
    listed = {m["id"]: m["kind"] for m in httpx.get(f"{server.url}/v1/models").json()["models"]}
    assert listed == {
        "bert": "text_classification",
        "ner": "token_classification",
        "text-classifier": "tensor",
    }
    assert info["output"]["labels"] == list(LABELS.values())
    assert info["embedding_layer"] == "model.bert.embeddings.word_embeddings"
    assert info["tokenizer"] is True and "integrated_gradients" in info["methods"]


@pytest.mark.parametrize("inputs", [TEXTS, PAIRS], ids=["texts", "pairs"])
def test_integrated_gradients_equal_captums(
    hf_server: tuple[Server, Path], inputs: list[Any]
) -> None:
    """One batch (padded to its longest text) over HTTP, Captum one example at a time."""
    server, path = hf_server
    targets = ["positive", "negative"]
    r = post(server, {"method": "integrated_gradients", "inputs": inputs, "target": targets,
                      "params": {"n_steps": 50}, "return_convergence_delta": True})  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["method"] == "layer_integrated_gradients"
    assert body["target"] == [2, 0]
    for i, text in enumerate(inputs):
        want, tokens = captum_lig(path, text if isinstance(text, str) else tuple(text), 2 - 2 * i)
        assert body["tokens"][i] == tokens
        got = np.asarray(body["attributions"][i][: len(tokens)])
        assert np.abs(want).max() > 1e-3  # the model is not flat
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9)  # Captum: float32 alphas
        assert np.all(np.asarray(body["attributions"][i][len(tokens) :]) == 0)  # padding
        assert abs(body["convergence_delta"][i]) < 1e-2
    # the layer method asked by name, at the embedding (named, or by default): the same one
    # score per token (CONTRACT 7.5), not a vector per token
    for params in ({"n_steps": 50}, {"n_steps": 50, "layer": body["attributed_layer"]}):
        r = post(server, {"method": "layer_integrated_gradients", "inputs": inputs,
                          "target": targets, "params": params})  # fmt: skip
        assert r.status_code == 200, r.text
        named = r.json()
        assert named["attributed_layer"] == body["attributed_layer"]
        np.testing.assert_allclose(named["attributions"], body["attributions"], rtol=1e-9)


def test_perturbation_over_tokens_and_predictions(hf_server: tuple[Server, Path]) -> None:
    server, _ = hf_server
    r = post(server, {"method": "feature_ablation", "inputs": TEXTS, "target": "predicted"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["attributions"][0]) == len(body["attributions"][1])  # one padded batch
    assert body["attributions"][0][0] == 0  # [CLS] is kept by the baseline: no change
    pred = httpx.post(f"{server.url}/v1/models/bert:predict", json={"instances": TEXTS})
    assert pred.status_code == 200, pred.text


@pytest.mark.parametrize(
    ("body", "status", "loc", "match"),
    [
        ({"inputs": [" ".join(["film"] * 20)]}, 422, ["body", "inputs"], "positions"),
        ({"target": "sarcastic"}, 422, ["body", "target"], "unknown label"),
        ({"inputs": [["only one"]]}, 422, ["body", "inputs"], ""),
    ],
)
def test_bad_requests_name_the_field(
    hf_server: tuple[Server, Path], body: dict[str, Any], status: int, loc: list[Any], match: str
) -> None:
    server, _ = hf_server
    req = {"method": "integrated_gradients", "inputs": TEXTS, "target": 0, **body}
    r = post(server, req)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["errors"][0]["loc"][: len(loc)] == loc and match in err["detail"]


def test_pairs_to_a_model_without_pair_encoding_are_refused(
    hf_server: tuple[Server, Path],
) -> None:
    server, _ = hf_server
    r = post(server, {"method": "saliency", "inputs": PAIRS, "target": 0}, "text-classifier")
    assert r.status_code == 422 and "pairs" in r.json()["detail"], r.text


def test_a_directory_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    """AutoTokenizer gives such a directory a tokenizer of special tokens only: detected."""
    bert_dir(tmp_path / "bert", tokenizer=False)
    (tmp_path / "models.toml").write_text('[[models]]\nid = "bert"\nsource = "hf:bert"\n')
    (spec,) = model_registry.load_specs(tmp_path / "models.toml")
    with pytest.raises(RegistryError) as e:
        model_registry.load(spec)
    assert e.value.model == "bert" and e.value.field == "source"
    assert "no tokenizer files" in str(e.value)


def test_a_classifier_declares_its_own_labels(tmp_path: Path) -> None:
    bert_dir(tmp_path / "bert")
    (tmp_path / "models.toml").write_text(
        '[[models]]\nid = "bert"\nsource = "hf:bert"\nlabels = ["a", "b", "c"]\n'
    )
    with pytest.raises(RegistryError) as e:
        model_registry.load_specs(tmp_path / "models.toml")
    assert e.value.field == "labels"


def test_token_ids_with_padding_marked_equal_the_texts(hf_server: tuple[Server, Path]) -> None:
    server, _ = hf_server
    body = {"method": "integrated_gradients", "target": 1, "params": {"n_steps": 16}}
    texts = post(server, {**body, "inputs": TEXTS}).json()
    ids = [[WORDS.index(t) for t in row] for row in texts["tokens"]]
    width = max(len(r) for r in ids)
    padded = [r + [-1] * (width - len(r)) for r in ids]
    r = post(server, {**body, "inputs": padded})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["attributions"], texts["attributions"], rtol=1e-9)
    bad = post(server, {**body, "inputs": [[2, -2, 3]]})
    assert bad.status_code == 422 and "-1 where a row is padded" in bad.json()["detail"]


def test_the_other_routes_serve_it_too(hf_server: tuple[Server, Path]) -> None:
    """KServe :explain, an attribution job, a rendered picture: as on the built-ins."""
    server, _ = hf_server
    body = {"method": "integrated_gradients", "inputs": PAIRS, "target": "positive",
            "params": {"n_steps": 16}}  # fmt: skip
    sync = post(server, body).json()
    explain = httpx.post(
        f"{server.url}/v1/models/bert:explain",
        json={"instances": PAIRS, "parameters": {k: v for k, v in body.items() if k != "inputs"}},
        timeout=60,
    )
    assert explain.status_code == 200, explain.text
    for i, e in enumerate(explain.json()["explanations"]):
        np.testing.assert_allclose(e["attributions"], sync["attributions"][i], rtol=1e-9)
    job = httpx.post(f"{server.url}/v1/models/bert/attribution-jobs", json=body, timeout=60)
    assert job.status_code == 202, job.text
    for _ in range(600):
        info = httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}").json()
        if info["status"] in ("succeeded", "failed", "cancelled"):
            break
        import time

        time.sleep(0.05)
    assert info["status"] == "succeeded", info
    result = httpx.get(f"{server.url}/v1/jobs/{job.json()['id']}/result").json()
    np.testing.assert_allclose(result["attributions"], sync["attributions"], rtol=1e-9)
    pic = post(server, {**body, "render": {"format": "html"}})
    assert pic.status_code == 200 and pic.json()["renders"][0]["media_type"] == "text/html"


def test_the_offline_cli_over_a_jsonl_of_pairs(tmp_path: Path) -> None:
    import json

    from service.cli import main as cli

    bert_dir(tmp_path / "bert")
    (tmp_path / "models.toml").write_text('[[models]]\nid = "bert"\nsource = "hf:bert"\n')
    lines = tmp_path / "pairs.jsonl"
    lines.write_text("".join(json.dumps({"inputs": p}) + "\n" for p in PAIRS))
    out = tmp_path / "out.npz"
    code = cli.main(["attribute", "--model", "bert", "--models", str(tmp_path / "models.toml"),
                     "--method", "feature_ablation", "--target", "negative", "-q",
                     "--inputs", str(lines), "--output", str(out)])  # fmt: skip
    assert code == 0
    with np.load(out, allow_pickle=False) as z:
        assert z["attributions"].shape[0] == 2
        assert [t for t in z["tokens"][0].tolist() if t][:1] == ["[CLS]"]


def test_token_classification_targets_a_position_and_label(
    hf_server: tuple[Server, Path],
) -> None:
    """[[position, label], ...] one per example (positions count the tokens the model sees,
    [CLS] at 0): Captum's LayerIntegratedGradients at that logit."""
    server, path = hf_server
    texts = ["the film was great", "a dull story"]
    targets = [[1, "PER"], [3, 2]]
    info = httpx.get(f"{server.url}/v1/models/ner").json()
    assert info["output"]["labels"] == list(NER_LABELS.values())
    r = post(server, {"method": "integrated_gradients", "inputs": texts, "target": targets,
                      "params": {"n_steps": 50}}, "ner")  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    for i, (text, want_target) in enumerate(zip(texts, [(1, 1), (3, 2)], strict=True)):
        want, tokens = captum_lig(path.parent / "ner", text, want_target)
        assert body["tokens"][i] == tokens
        np.testing.assert_allclose(body["attributions"][i][: len(tokens)], want, rtol=1e-6,
                                   atol=1e-9)  # fmt: skip
        assert np.abs(want).max() > 1e-3


@pytest.mark.parametrize(
    ("target", "match"),
    [([[99, "PER"], [0, "O"]], "out of range"), ("PER", "[position, label]"),
     ([[1, "DATE"], [0, "O"]], "unknown label"), ([[1], [0, "O"]], "[position, label]")],
)  # fmt: skip
def test_token_classification_bad_targets(
    hf_server: tuple[Server, Path], target: Any, match: str
) -> None:
    server, _ = hf_server
    r = post(server, {"method": "saliency", "inputs": TEXTS, "target": target}, "ner")
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["loc"][:2] == ["body", "target"] and match in r.json()["detail"]


def test_the_readme_walk_through_builds_what_it_serves(tmp_path: Path) -> None:
    """``python -m tests.hf_dirs DIR`` (the README's first step): a models.toml that loads."""
    from tests import hf_dirs

    toml = hf_dirs.build(tmp_path / "hf")
    specs = {s.id: s for s in model_registry.load_specs(toml)}
    assert specs["reviews"].output.labels == tuple(LABELS.values())
    assert specs["ner"].output.shape == (None, len(NER_LABELS))
    assert specs["flowers"].inputs[0].shape == (None, 3, 32, 32)
    assert (tmp_path / "hf" / "photos" / "photo.png").is_file()


def test_concurrent_texts_merge_and_equal_one_by_one(hf_server: tuple[Server, Path]) -> None:
    """Texts of different lengths batch together (the padding is masked): merged answers
    equal the ones computed alone, at each request's own width."""
    from concurrent.futures import ThreadPoolExecutor

    server, _ = hf_server
    words = ["the", "film", "was", "great", "a", "dull", "plot", "not", "very", "good"]
    texts = [" ".join(words[: 2 + i % 8]) for i in range(12)]
    body = {"method": "integrated_gradients", "target": "positive", "params": {"n_steps": 64}}
    alone = [post(server, {**body, "inputs": [t]}).json() for t in texts]
    for _ in range(3):  # a loaded machine may send the twelve too slowly to queue together
        with ThreadPoolExecutor(12) as pool:
            together = list(pool.map(lambda t: post(server, {**body, "inputs": [t]}).json(), texts))
        if max(r["merged_requests"] for r in together) > 1:
            break
    assert max(r["merged_requests"] for r in together) > 1
    for a, b in zip(alone, together, strict=True):
        assert b["tokens"] == a["tokens"]
        assert np.shape(b["attributions"]) == np.shape(a["attributions"])
        np.testing.assert_allclose(b["attributions"], a["attributions"], rtol=1e-6, atol=1e-9)


def test_an_expensive_request_of_texts_is_split_and_joined(hf_server: tuple[Server, Path]) -> None:
    """A request of texts of many lengths, expensive enough to be cut into pieces of about
    ``split_ms`` (each piece tokenized on its own, so of its own width): joined, it is the
    one-batch answer (zeros past each text's end), not a request that waits out its
    deadline."""
    server, _ = hf_server
    words = ["the", "film", "was", "great", "a", "dull", "plot", "not", "very", "good"]
    texts = [" ".join(words[: 1 + (7 * i) % 10]) for i in range(10)]
    # 300 steps took 191 ms on an AVX-512 Xeon, under the 200 asserted below: 1000
    body = {"method": "integrated_gradients", "target": "positive", "params": {"n_steps": 1000}}
    assert post(server, {**body, "inputs": texts[:1]}).status_code == 200  # its rate, known
    r = post(server, {**body, "inputs": texts})
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["timing_ms"]["compute"] > 200  # more than a piece (split_ms: 100)
    for i, text in enumerate(texts):
        alone = post(server, {**body, "inputs": [text]}).json()
        assert got["tokens"][i] == alone["tokens"][0]
        width = len(alone["tokens"][0])
        np.testing.assert_allclose(got["attributions"][i][:width], alone["attributions"][0],
                                   rtol=1e-6, atol=1e-9)  # fmt: skip
        assert not np.any(got["attributions"][i][width:])


def test_partition_over_texts_equals_shaps_text_masker(hf_server: tuple[Server, Path]) -> None:
    """``partition`` on a text model is shap's default for texts: ``PartitionExplainer`` with
    ``shap.maskers.Text(tokenizer)`` on a function of strings (a pipeline): the token tree
    shap builds from the tokenizer, 5 coalitions a round, hidden tokens as the tokenizer's
    mask token, the tokens it adds kept."""
    import shap
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    server, path = hf_server
    texts = ["the film was great, not dull.", "a very good plot (the acting was bad) but story"]
    r = post(server, {"method": "partition", "inputs": texts, "target": 2,
                      "params": {"max_evals": 40}})  # fmt: skip
    assert r.status_code == 200, r.text
    got = r.json()
    tok = AutoTokenizer.from_pretrained(path)
    bert = AutoModelForSequenceClassification.from_pretrained(path).eval().double()

    def f(strings: np.ndarray) -> np.ndarray:  # as a text pipeline: strings in, logits out
        out = []
        for s in strings:
            ids = torch.tensor([tok(str(s))["input_ids"]])
            with torch.no_grad():
                out.append(bert(input_ids=ids).logits[0].numpy())
        return np.stack(out)

    explainer = shap.PartitionExplainer(f, shap.maskers.Text(tok))
    for i, text in enumerate(texts):
        theirs = explainer([text], max_evals=40, outputs=[2], silent=True)
        n = len(theirs.values[0])
        np.testing.assert_allclose(got["attributions"][i][:n], theirs.values[0][:, 0], atol=1e-9)
        assert all(v == 0 for v in got["attributions"][i][n:])  # the batch's padding
        np.testing.assert_allclose(got["base_values"][i], theirs.base_values[0][0], atol=1e-9)


def test_units_group_a_fast_tokenizers_tokens_by_their_offsets(
    hf_server: tuple[Server, Path],
) -> None:
    """Sentence and word units of a BERT classifier: each unit's word pieces ablated together
    to the pad token ([CLS] and [SEP] kept), as Captum's FeatureAblation with that mask; the
    answer is one value per unit with its character offsets."""
    from captum.attr import FeatureAblation
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    server, path = hf_server
    text = "the film was great. a dull plot!"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).double().eval()
    enc = tokenizer(text, return_offsets_mapping=True, return_special_tokens_mask=True)
    ids = torch.tensor([enc["input_ids"]])
    specials = torch.tensor([enc["special_tokens_mask"]]).bool()
    for units, starts in (("sentence", [0, 20]), ("word", [0, 4, 9, 13, 20, 22, 27])):
        r = post(server, {"method": "feature_ablation", "inputs": [text], "target": "positive",
                          "units": units})  # fmt: skip
        assert r.status_code == 200, r.text
        body = r.json()
        assert [u["start"] for u in body["units"][0]] == starts
        pieces = zip(enc["offset_mapping"], enc["special_tokens_mask"], strict=True)
        unit = [
            0 if sp else max(k for k, s in enumerate(starts) if s <= a) for (a, _), sp in pieces
        ]
        mask = torch.tensor([unit])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = FeatureAblation(lambda x: model(input_ids=x).logits).attribute(
                ids, target=2, baselines=torch.where(specials, ids, 0), feature_mask=mask
            )
        first = [
            int((mask[0] == k).logical_and(~specials[0]).nonzero()[0]) for k in range(len(starts))
        ]
        np.testing.assert_allclose(body["attributions"][0], want[0, first].numpy(), rtol=1e-9)
        assert body["tokens"][0] == [u["text"] for u in body["units"][0]]
