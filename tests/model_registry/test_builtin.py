"""The built-in demo models: committed weights load and are accurate; retraining reproduces
them; the text tokenizer keeps tokens aligned with ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import model_registry
from model_registry import RegistryError, builtin
from model_registry.builtin import text, train

#: the classifiers of a recipe (tiny-lm, the causal language model, has its own tests in
#: test_tiny_lm.py; tabular-noisy, trained on wrong labels on purpose, its own below)
NAMES = [n for n in builtin.BUILTINS if n in train.RECIPES]


def loaded(name: str) -> model_registry.LoadedModel:
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == name]
    return model_registry.load(spec)


@pytest.mark.parametrize("name", NAMES)
def test_committed_weights_are_accurate_on_fresh_data(name: str) -> None:
    m = loaded(name)
    assert m.device == torch.device("cpu") and not m.model.training
    assert train.accuracy(name, m.model) >= 0.95
    assert m.spec.output.shape == (len(m.spec.output.labels),)
    assert set(m.spec.layers) <= {n for n, _ in m.model.named_modules()}


@pytest.mark.parametrize("name", NAMES)
def test_retraining_reproduces_the_committed_model(name: str) -> None:
    # Same platform: bit for bit (train.py is single-threaded and deterministic). Another CPU
    # may round differently along the way, so what must hold everywhere is the same answers.
    fresh = train.RECIPES[name].build()
    fresh.load_state_dict(train.train(name))
    fresh.eval()
    committed = loaded(name).model
    x, _ = train.RECIPES[name].make_data(1000, torch.Generator().manual_seed(99))
    with torch.no_grad():
        agree = (fresh(x).argmax(1) == committed(x).argmax(1)).double().mean()
    assert agree >= 0.99


def test_tabular_noisy_retrains_to_its_files_and_its_wrong_labels_stand_out(
    tmp_path: Path,
) -> None:
    """Retraining gives the committed checkpoints' answers; self-influence over the shipped
    data and checkpoints (TracInCP) ranks all 12 wrong labels among the top 20."""
    import methods
    from model_registry.builtin import noisy, tabular

    with train.deterministic():
        final, checkpoints = noisy.train()
    x, y, flipped = noisy.data()
    saved = np.load(noisy.FILES / "train.npz")
    np.testing.assert_array_equal(saved["x"], x.numpy())
    np.testing.assert_array_equal(saved["labels"], y.numpy())
    committed = loaded("tabular-noisy").model
    fresh = tabular.TabularMLP()
    fresh.load_state_dict(final)
    probe = tabular.make_data(1000, torch.Generator().manual_seed(99))[0]
    with torch.no_grad():
        assert (fresh(probe).argmax(1) == committed(probe).argmax(1)).double().mean() >= 0.99
    assert train.accuracy("tabular-mlp", committed) >= 0.9
    for i, state in enumerate(checkpoints, 1):
        shipped = torch.load(noisy.FILES / f"checkpoint-{i}.pt")
        for k, v in state.items():
            torch.testing.assert_close(shipped[k], v, rtol=1e-4, atol=1e-5)
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-noisy")
    ckpts = [{"weights": p, "lr": lr} for p, lr in spec.influence.checkpoints]
    scores = methods.self_influence(committed, x, y, checkpoints=ckpts)
    assert set(flipped.tolist()) <= set(torch.topk(scores, 20).indices.tolist())


def test_weights_stay_small() -> None:
    every = list(builtin.BUILTINS)
    sizes = [builtin.WEIGHTS_DIR.joinpath(f"{n}.safetensors").stat().st_size for n in every]
    assert max(sizes) < 300_000


def test_tokenizer_aligns_tokens_with_ids() -> None:
    tok = loaded("text-classifier").tokenizer
    assert tok is not None
    ids, tokens = tok(["The plot was GREAT!", "awful, zorblax film", ""])
    assert tokens == [["the", "plot", "was", "great"], ["awful", "zorblax", "film"], []]
    assert ids.dtype == torch.int64 and ids.shape == (3, 4)
    index = {w: i for i, w in enumerate(text.VOCAB)}
    assert ids[0].tolist() == [index["the"], index["plot"], index["was"], index["great"]]
    assert ids[1].tolist() == [index["awful"], text.UNK_ID, index["film"], text.PAD_ID]
    assert ids[2].tolist() == [text.PAD_ID] * 4
    assert tok([""])[0].shape == (1, 1)  # never a zero-length sequence
    with pytest.raises(TypeError, match="not a single string"):
        tok("a bare string")


@pytest.mark.parametrize(
    ("written", "words"),
    [
        ("great 🎬 film ñ", ["great", "🎬", "film", "ñ"]),  # both were dropped
        ("Naïve CAFÉ, don't!", ["naïve", "café", "don't"]),  # "na", "ve", "caf"
        ("cafe\u0301 1\ufe0f\u20e3", ["cafe\u0301", "1\ufe0f\u20e3"]),  # marks stay with it
        ("👩\u200d💻 👍🏽🇫🇷🇩🇪", ["👩\u200d💻", "👍🏽", "🇫🇷", "🇩🇪"]),  # an emoji as written
        ("x+y = $5", ["x", "+", "y", "=", "$", "5"]),  # symbols are not punctuation
        ("中文 テスト", ["中文", "テスト"]),
        ("!!! ... ¿? «» snake_case", ["snake", "case"]),
        ("!!! ... ¿? «»", []),  # punctuation alone: nothing to attribute (the service's 422)
    ],
)
def test_unknown_characters_keep_their_spelling(written: str, words: list[str]) -> None:
    """Every character but white space and punctuation is in ``tokens`` as written (lower-
    cased), with the unknown id where the vocabulary lacks it: an ``[a-z0-9]`` pattern dropped
    the others silently."""
    ids, tokens = text.WordTokenizer()([written])
    assert tokens == [words]
    want = [text.VOCAB.index(w) if w in text.VOCAB else text.UNK_ID for w in words]
    assert ids[0].tolist() == (want or [text.PAD_ID])


def test_padding_does_not_change_the_prediction() -> None:
    m = loaded("text-classifier")
    assert m.tokenizer is not None
    ids, _ = m.tokenizer(["what a great film", "what a great film and a very long tail of words"])
    padded = torch.cat([ids[:1, :4], torch.zeros(1, ids.shape[1] - 4, dtype=torch.long)], 1)
    torch.testing.assert_close(m.model(ids[:1, :4]), m.model(padded))


def test_weights_for_another_vocabulary_are_refused(tmp_path: Path) -> None:
    src = builtin.WEIGHTS_DIR / "text-classifier.safetensors"
    meta = {"attrserve": json.dumps({"vocab": ["[PAD]", "[UNK]", "other"]})}
    save_file(load_file(str(src)), str(tmp_path / "t.safetensors"), metadata=meta)
    with pytest.raises(RegistryError, match="different vocabulary"):
        builtin.build("text-classifier", tmp_path / "t.safetensors")


def test_every_model_that_takes_text_has_its_tokenizer() -> None:
    """tiny-lm's tokenizer used to hide in ``extra``: the callable is ``LoadedModel.tokenizer``
    for causal LMs too (the object attribute_generation takes is ``text_tokenizer``)."""
    specs = {s.id: s for s in model_registry.builtin_specs()}
    lm = model_registry.load(specs["tiny-lm"])
    assert lm.tokenizer is not None and lm.text_tokenizer is not None
    ids, tokens = lm.tokenizer(["grace lives in", "paris"])
    assert ids.dtype == torch.int64 and ids.shape == (2, max(map(len, tokens)))
    for row, toks in zip(ids, tokens, strict=True):
        assert row[: len(toks)].tolist() == lm.text_tokenizer.encode(" ".join(toks[1:]))
    text_model = model_registry.load(specs["text-classifier"])
    assert text_model.tokenizer is not None and text_model.text_tokenizer is None
