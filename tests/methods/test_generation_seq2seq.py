"""Encoder-decoders (``attribute_generation`` on T5, BART and Marian built from configs): the
answer attributed to the source's tokens. Gradient methods against inseq 0.7.1 (its
encoder-decoder wrapper); perturbation methods against plain forwards of each ablated source;
a generated answer is the model's own ``generate``."""

from __future__ import annotations

import functools
import warnings
from typing import Any

import pytest
import torch
import transformers

import methods
from tests.methods.test_generation import WORDS, gpt2_tokenizer

SOURCE = "my friend alice lives in the city"
KINDS = ("bart", "marian", "t5")


@functools.cache
def seq2seq(kind: str) -> Any:
    """A tiny encoder-decoder of the test vocabulary, in float64 (the decoder starts from
    <pad>, as Marian and T5 do)."""
    torch.manual_seed(0)
    common: dict[str, Any] = {
        "vocab_size": len(WORDS), "pad_token_id": 3, "eos_token_id": 2, "bos_token_id": 1,
        "decoder_start_token_id": 3,
    }  # fmt: skip
    sizes = {
        "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2,
        "decoder_attention_heads": 2, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
        "max_position_embeddings": 64,
    }  # fmt: skip
    if kind == "bart":
        model = transformers.BartForConditionalGeneration(
            transformers.BartConfig(**sizes, **common)
        )
    elif kind == "marian":  # scales its embeddings by sqrt(d_model) in the encoder
        model = transformers.MarianMTModel(transformers.MarianConfig(**sizes, **common))
    else:  # relative positions, no embedding scale
        cfg = transformers.T5Config(
            d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, **common
        )
        model = transformers.T5ForConditionalGeneration(cfg)
    return model.double().eval()


def inseq_rows(model: Any, method: str) -> tuple[torch.Tensor, list[int]]:
    """inseq's attributions of each answer step to the source tokens ([T, source]), summed
    over the embedding dim, and the answer ids it attributed (it encodes the target with the
    tokenizer's special tokens: <bos> first)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import inseq  # the oracle (make install-dev), imported where used: 3 s of imports

        m = inseq.load_model(model, method, tokenizer=gpt2_tokenizer())
        out = m.attribute(SOURCE, "paris rome", show_progress=False)
    seq = out.sequence_attributions[0]
    return seq.source_attributions.sum(-1).T, [t.id for t in seq.target[1:]]


@pytest.mark.parametrize("method", ["saliency", "input_x_gradient"])
@pytest.mark.parametrize("kind", KINDS)
def test_gradient_methods_equal_inseq(kind: str, method: str) -> None:
    model = seq2seq(kind).float()  # inseq's own precision
    try:
        theirs, answer = inseq_rows(model, method)
        ours = methods.attribute_generation(
            model, gpt2_tokenizer(), SOURCE, method, target=answer, target_fn="prob"
        )
    finally:
        model.double()
    assert float(theirs.abs().max()) > 0
    torch.testing.assert_close(ours.token_attr, theirs, rtol=1e-4, atol=1e-7)
    assert ours.input_tokens == gpt2_tokenizer().convert_ids_to_tokens(
        gpt2_tokenizer().encode(SOURCE)
    )


def _ablated_scores(model: Any, source: list[int], answer: list[int], position: int) -> Any:
    ids = torch.tensor([source])
    if position >= 0:
        ids[0, position] = 0
    dec = torch.tensor([[model.config.decoder_start_token_id, *answer[:-1]]])
    logp = torch.log_softmax(model(input_ids=ids, decoder_input_ids=dec).logits, -1)[0]
    return logp.gather(-1, torch.tensor(answer)[:, None])[:, 0]


@pytest.mark.parametrize("kind", KINDS)
def test_feature_ablation_equals_plain_forwards_of_each_ablated_source(kind: str) -> None:
    model, tok = seq2seq(kind), gpt2_tokenizer()
    res = methods.attribute_generation(model, tok, SOURCE, "feature_ablation", target="paris rome")
    source, answer = tok.encode(SOURCE), res.output_ids
    assert answer == tok.convert_tokens_to_ids(["paris", "rome"])  # no end of sequence added
    with torch.no_grad():
        full = _ablated_scores(model, source, answer, -1)
        want = torch.stack(
            [full - _ablated_scores(model, source, answer, j) for j in range(len(source))], 1
        )
    torch.testing.assert_close(res.token_attr, want)
    torch.testing.assert_close(res.output_log_probs, full)


def test_a_generated_answer_is_the_model_s_own_and_templates_work() -> None:
    model, tok = seq2seq("bart"), gpt2_tokenizer()
    res = methods.attribute_generation(
        model, tok, SOURCE, "shapley_value_sampling", gen_args={"max_new_tokens": 4}, n_samples=2,
        seed=0,
    )  # fmt: skip
    with torch.no_grad():
        out = model.generate(torch.tensor([tok.encode(SOURCE)]), max_new_tokens=4, do_sample=False)
    assert res.output_ids == out[0, 1:].tolist()
    templated = methods.attribute_generation(
        model, tok, "my friend {} lives in {}", "feature_ablation", target="paris",
        features=["alice", "the city"], baselines=["bob", ""],
    )  # fmt: skip
    assert templated.token_attr.shape == (1, 2)


def test_context_attribution_on_an_encoder_decoder() -> None:
    model, tok = seq2seq("t5"), gpt2_tokenizer()
    res = methods.attribute_context(
        model, tok, "alice lives in paris. bob lives in rome.", "who lives in paris",
        "alice lives in paris.", n_ablations=8,
    )  # fmt: skip
    assert res.units == ["alice lives in paris.", "bob lives in rome."]
    assert res.scores.shape == (1, 2) and not res.params["chat_template"]


@pytest.mark.parametrize(
    ("kind", "method", "kw"),
    [
        ("bart", "feature_ablation", {"target": "paris rome"}),
        ("t5", "shapley_value_sampling", {"gen_args": {"max_new_tokens": 3}, "n_samples": 2}),
        ("marian", "input_x_gradient", {"target": "paris rome"}),
        ("bart", "saliency", {"gen_args": {"max_new_tokens": 3}}),
    ],
)
def test_a_stream_equals_the_whole_attribution(kind: str, method: str, kw: dict[str, Any]) -> None:
    """An encoder-decoder streams as a causal LM does (CONTRACT 8.3): one row per answer
    token, as soon as it is known, then the whole result, equal to attribute_generation's
    (a given answer, or the model's own greedy one)."""
    model, tok = seq2seq(kind), gpt2_tokenizer()
    whole = methods.attribute_generation(model, tok, SOURCE, method, seed=0, **kw)
    *steps, last = methods.stream_generation(model, tok, SOURCE, method, seed=0, **kw)
    assert [s.token_id for s in steps] == whole.output_ids == last.output_ids
    torch.testing.assert_close(torch.stack([s.attr for s in steps]), whole.token_attr)
    torch.testing.assert_close(last.token_attr, whole.token_attr)
    torch.testing.assert_close(last.seq_attr, whole.seq_attr)
    torch.testing.assert_close(last.output_log_probs, whole.output_log_probs)


def test_a_stream_over_the_memory_budget_decodes_again_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the decoders' caches do not fit the memory budget, each step runs the sources
    and the answer so far again: the same rows, nothing kept."""
    model, tok = seq2seq("bart"), gpt2_tokenizer()
    whole = methods.attribute_generation(
        model, tok, SOURCE, "feature_ablation", target="paris rome"
    )
    monkeypatch.setattr("methods.generation.stream.memory_budget", lambda device: 1)
    stream = methods.stream_generation(model, tok, SOURCE, "feature_ablation", target="paris rome")
    *steps, last = stream
    torch.testing.assert_close(torch.stack([s.attr for s in steps]), whole.token_attr)
    torch.testing.assert_close(last.seq_attr, whole.seq_attr)
