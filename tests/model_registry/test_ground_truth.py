"""The built-in models' known answers, found by the attribution engine (README: built-in models)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import methods
import model_registry
from methods.tokens import per_token
from model_registry.builtin import image, tabular, text


def single(a: torch.Tensor | tuple[torch.Tensor, ...]) -> torch.Tensor:
    assert isinstance(a, torch.Tensor)  # one input in, one attribution tensor out
    return a


def loaded(name: str) -> model_registry.LoadedModel:
    (spec,) = [s for s in model_registry.builtin_specs() if s.id == name]
    return model_registry.load(spec)


def test_tabular_attributions_concentrate_on_features_0_and_3() -> None:
    model = loaded("tabular-mlp").model
    x, _ = tabular.make_data(128, torch.Generator().manual_seed(5))
    target = model(x).argmax(1).tolist()
    a = single(methods.attribute(model, x, "integrated_gradients", target=target).attributions)
    a = a.abs()
    share = a[:, list(tabular.RELEVANT)].sum() / a.sum()
    assert share >= 0.8


def test_image_attributions_fall_in_the_bright_quadrant() -> None:
    model = loaded("image-cnn").model
    x, y = image.make_data(32, torch.Generator().manual_seed(5))
    a = methods.attribute(model, x, "integrated_gradients", target=y.tolist(), n_steps=32)
    mass = single(a.attributions).abs().sum(1)  # [N, 32, 32]
    per_quadrant = torch.stack(
        [(mass * image.quadrant_mask(q)).sum((1, 2)) for q in range(4)], dim=1
    )
    share = per_quadrant[torch.arange(len(y)), y] / mass.sum((1, 2))
    assert (per_quadrant.argmax(1) == y).all()  # the quadrant is always the largest share
    assert share.mean() >= 0.6  # and holds most of the mass (a quadrant is a quarter of the area)


SENTENCES = [  # (text, the sentiment word, its class)
    ("the plot was great and the music too", "great", 1),
    ("this movie is really awful", "awful", 0),
    ("i loved the acting in this film", "loved", 1),
    ("the script was boring and the cast was zorblax", "boring", 0),
    ("a wonderful story with the director at it", "wonderful", 1),
    ("they were so disappointing in the ending", "disappointing", 0),
]


def _ids_and_targets() -> tuple[torch.Tensor, list[list[str]], list[int], list[int]]:
    tok = text.WordTokenizer()
    ids, tokens = tok([s for s, _, _ in SENTENCES])
    where = [toks.index(word) for toks, (_, word, _) in zip(tokens, SENTENCES, strict=True)]
    return ids, tokens, [c for _, _, c in SENTENCES], where


class AfterEmbedding(nn.Module):
    """The text classifier from its embedding output on: IG can then run on a float input."""

    def __init__(self, model: text.TextClassifier, ids: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.mask = (ids != text.PAD_ID).unsqueeze(-1).float()

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        k = emb.shape[0] // self.mask.shape[0]  # path points arrive as whole copies of the batch
        mask = self.mask.repeat(k, 1, 1)
        pooled = (emb * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.model.fc2(self.model.relu(self.model.fc1(pooled)))


def test_text_sentiment_word_gets_the_top_score_via_the_embedding_output() -> None:
    model = loaded("text-classifier").model
    ids, _, targets, where = _ids_and_targets()
    emb = model.embedding(ids)
    wrapper = AfterEmbedding(model, ids)
    torch.testing.assert_close(wrapper(emb), model(ids))  # the wrapper is the same function
    pad = model.embedding(torch.zeros_like(ids))  # baseline: every token replaced by the pad
    res = methods.attribute(
        wrapper, emb, "integrated_gradients", target=targets, baselines=pad,
        internal_batch_size=len(ids),  # whole copies of the batch, so the mask lines up
    )  # fmt: skip
    a = single(res.attributions).sum(-1)
    assert a.argmax(1).tolist() == where


@pytest.mark.parametrize("method", ["layer_integrated_gradients"])
def test_text_sentiment_word_gets_the_top_score_via_layer_methods(method: str) -> None:
    m = loaded("text-classifier")
    ids, _, targets, where = _ids_and_targets()
    res = methods.attribute(
        m.model, ids, method, target=targets, baselines=text.PAD_ID, layer=m.spec.embedding_layer
    )
    scores = per_token(res.attributions)
    assert isinstance(scores, torch.Tensor)
    assert scores.argmax(1).tolist() == where
