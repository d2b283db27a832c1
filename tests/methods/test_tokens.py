"""Token models: layer integrated gradients on embeddings, token-id baselines, per-token
scores; a plain nn.Embedding classifier and a tiny BertForSequenceClassification (built from a
config, nothing downloaded) with attention masks as additional_forward_args."""

from __future__ import annotations

import pytest
import torch
from captum.attr import LayerIntegratedGradients
from torch import nn

import methods
from methods.tokens import per_token

PAD = 0


class BagClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 6, padding_idx=PAD)
        self.fc = nn.Linear(6, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.emb(ids)).mean(1))


class BertLogits(nn.Module):
    """BertForSequenceClassification returning logits (the engine needs a tensor output)."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
            num_labels=2,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        torch.manual_seed(0)
        self.m = BertForSequenceClassification(cfg)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, attention_mask=mask).logits


def _ids() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.tensor([[2, 7, 9, 4, 11, 3], [2, 5, 13, 3, PAD, PAD]])
    return ids, (ids != PAD).long()


def test_embedding_classifier_matches_captum_and_is_complete() -> None:
    torch.manual_seed(0)
    m = BagClassifier().double().eval()
    ids, _ = _ids()
    r = methods.attribute(
        m,
        ids,
        "layer_integrated_gradients",
        target=1,
        baselines=PAD,
        layer="emb",
        n_steps=64,
        return_convergence_delta=True,
    )
    ref = LayerIntegratedGradients(m, m.emb).attribute(ids, baselines=PAD, target=1, n_steps=64)
    torch.testing.assert_close(r.attributions, ref, rtol=1e-6, atol=1e-9)
    assert float(r.convergence_delta.abs().max()) < 1e-6
    scores = per_token(r.attributions)
    assert scores.shape == ids.shape
    torch.testing.assert_close(scores.sum(1), r.attributions.sum((1, 2)))
    # a reference sequence as the baseline (one row, broadcast to the batch)
    ref_seq = torch.tensor([[2, PAD, PAD, PAD, PAD, 3]])
    r2 = methods.attribute(
        m, ids, "layer_integrated_gradients", target=1, baselines=ref_seq, layer="emb", n_steps=16
    ).attributions
    ref2 = LayerIntegratedGradients(m, m.emb).attribute(
        ids, baselines=ref_seq.expand(2, -1), target=1, n_steps=16
    )
    torch.testing.assert_close(r2, ref2, rtol=1e-6, atol=1e-9)


def test_token_ids_are_rejected_by_input_gradient_methods() -> None:
    m = BagClassifier().double()
    with pytest.raises(methods.InvalidTypeError, match="layer_integrated_gradients"):
        methods.attribute(m, _ids()[0], "integrated_gradients", target=1)


@pytest.mark.parametrize("layer", ["m.bert.embeddings.word_embeddings", "m.bert.embeddings"])
def test_tiny_bert_matches_captum(layer: str) -> None:
    pytest.importorskip("transformers")
    m = BertLogits().double().eval()
    ids, mask = _ids()
    r = methods.attribute(
        m,
        ids,
        "layer_integrated_gradients",
        target=1,
        baselines=PAD,
        additional_forward_args=(mask,),
        layer=layer,
        n_steps=20,
        internal_batch_size=16,
        return_convergence_delta=True,
    )
    lig = LayerIntegratedGradients(m, m.get_submodule(layer))
    ref, ref_delta = lig.attribute(
        ids,
        baselines=PAD,
        target=1,
        additional_forward_args=(mask,),
        n_steps=20,
        internal_batch_size=16,
        return_convergence_delta=True,
    )
    torch.testing.assert_close(r.attributions, ref, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(r.convergence_delta, ref_delta, rtol=1e-6, atol=1e-8)
    assert per_token(r.attributions).shape == ids.shape
    assert not any(mod._forward_hooks or mod._forward_pre_hooks for mod in m.modules())


def test_per_token_rejects_non_embedding_shapes() -> None:
    with pytest.raises(methods.InvalidArgumentError):
        per_token(torch.zeros(2, 3))
