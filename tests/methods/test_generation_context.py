"""Context attribution (``methods.attribute_context``): against the context-cite package 0.0.4
(the same masks, scores and surrogate, on a random GPT-2 and a BPE tokenizer with a chat
template), a planted case (a model made to copy must rank the copied sentence first), and the
mistakes a caller makes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import methods
from methods.errors import AttributionError
from methods.generation import units
from methods.generation.context import ablation_masks, surrogate
from tests.methods.context_models import CopyLM, bpe_tokenizer, random_gpt2
from tests.methods.test_generation import tiny_lm

CONTEXT = (
    "Paris is the capital of France. The secret code is blue seven. Bob likes green apples. "
    "The weather in Rome was sunny. Alice works at the bank. The train to Oslo leaves at noon."
)
QUERY = "Where does Alice work?"
#: context-cite's own warnings on a CPU (it asks for CUDA autocast, and sets its logger up)
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.cuda.amp.autocast:FutureWarning"),
    pytest.mark.filterwarnings("ignore:User provided device_type of 'cuda':UserWarning"),
    pytest.mark.filterwarnings("ignore:.*CUDA is not available.*:UserWarning"),
]
ANSWER = " Alice works at the bank. The secret code is blue seven."


@functools.cache
def context_cite(nltk_dir: str) -> Any:
    """The package, imported offline: its import asks NLTK to download ``punkt_tab`` (there is
    no network here), and its sentence splitter reads that model's files; a Punkt model with
    no trained statistics (and a few abbreviations) is what is given instead."""
    import nltk

    english = Path(nltk_dir) / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (english / name).write_text("")
    (english / "abbrev_types.txt").write_text("dr\nmr\nmrs\ne.g\ni.e\n")
    nltk.data.path.insert(0, nltk_dir)
    nltk.download = lambda *a, **k: True
    import context_cite

    return context_cite


@pytest.fixture(scope="module")
def cc(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return context_cite(str(tmp_path_factory.mktemp("nltk")))


def their_citer(cc: Any, model: Any, tok: Any, n: int, template: str) -> Any:
    citer = cc.ContextCiter(model, tok, CONTEXT, QUERY, num_ablations=n, prompt_template=template)
    _, prompt = citer._get_prompt_ids(return_prompt=True)
    citer._cache["output"] = prompt + ANSWER  # the answer given, not generated
    return citer


@pytest.mark.parametrize("n", [16, 48])
def test_equal_to_context_cite_on_its_own_masks(cc: Any, n: int) -> None:
    tok = bpe_tokenizer()
    model = random_gpt2(len(tok))
    template = "Context: {context}\n\nQuery: {query}"
    ours = methods.attribute_context(
        model, tok, CONTEXT, QUERY, ANSWER, n_ablations=n, prompt_template=template,
        score="logit_prob",
    )  # fmt: skip
    citer = their_citer(cc, model, tok, n, template)
    assert ours.units == citer.sources
    assert ours.answer == citer.response
    np.testing.assert_array_equal(ours.masks.numpy(), citer._masks)
    for s, sentence in enumerate(ours.answer_sentences):
        start = citer.response.index(sentence)
        theirs = citer.get_attributions(start, start + len(sentence), verbose=False)
        scale = max(1.0, float(np.abs(theirs).max()))
        # sklearn's Lasso stops at a duality gap of 1e-4; ours runs to 1e-10
        np.testing.assert_allclose(ours.scores[s].numpy(), theirs, atol=2e-3 * scale)
        assert ours.top[s][0] == int(np.argmax(theirs))


def test_summed_log_probability_equals_context_cite_s_aggregate(cc: Any) -> None:
    """score="log_prob" (the default): their per-token values, aggregated as log-probabilities,
    through their solver."""
    from context_cite.solver import LassoRegression
    from context_cite.utils import aggregate_logit_probs

    tok = bpe_tokenizer()
    model = random_gpt2(len(tok))
    ours = methods.attribute_context(model, tok, CONTEXT, QUERY, ANSWER, n_ablations=40)
    citer = their_citer(cc, model, tok, 40, "{context}\n\n{query}")
    for s, (a, b) in enumerate(ours.sentence_tokens):
        logp = aggregate_logit_probs(citer._logit_probs[:, a:b], output_type="log_prob")
        np.testing.assert_allclose(ours.outputs[:, s].numpy(), logp, rtol=1e-4, atol=1e-4)
        w, _ = LassoRegression().fit(citer._masks, logp, b - a)
        np.testing.assert_allclose(ours.scores[s].numpy(), w, atol=2e-3 * max(1, abs(w).max()))


def test_the_surrogate_is_scikit_learn_s_lasso_pipeline() -> None:
    from sklearn.linear_model import Lasso
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    g = torch.Generator().manual_seed(3)
    x = (torch.rand(64, 12, generator=g) < 0.5).double()
    y = x @ torch.randn(12, 2, generator=g, dtype=torch.float64) + 0.3 * torch.randn(
        64, 2, generator=g, dtype=torch.float64
    )
    counts = torch.tensor([3.0, 7.0], dtype=torch.float64)
    w, b = surrogate(x, y, counts, 0.01)
    for s in range(2):
        scaler, las = StandardScaler(), Lasso(alpha=0.01, tol=1e-12, max_iter=100_000)
        make_pipeline(scaler, las).fit(x.numpy(), y[:, s].numpy() / counts[s].item())
        want = las.coef_ / scaler.scale_ * counts[s].item()
        np.testing.assert_allclose(w[s].numpy(), want, atol=1e-7)
        bias = (las.intercept_ - (scaler.mean_ / scaler.scale_) @ las.coef_) * counts[s].item()
        assert float(b[s]) == pytest.approx(bias, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 11])
def test_masks_are_context_cite_s_for_a_seed(cc: Any, seed: int) -> None:
    from context_cite.utils import _create_mask

    ours = ablation_masks(20, 9, 0.5, seed)
    for i in range(20):
        np.testing.assert_array_equal(ours[i], _create_mask(9, 0.5, seed + i))


def test_a_model_made_to_copy_ranks_the_copied_sentence_first() -> None:
    tok = bpe_tokenizer()
    model = CopyLM(len(tok))
    res = methods.attribute_context(model, tok, CONTEXT, QUERY, ANSWER, n_ablations=64)
    assert res.answer_sentences == ["Alice works at the bank.", "The secret code is blue seven."]
    assert res.top[0][0] == 4  # "Alice works at the bank."
    assert res.top[1][0] == 1  # "The secret code is blue seven."
    for s, copied in ((0, 4), (1, 1)):
        others = [float(v) for j, v in enumerate(res.scores[s]) if j != copied]
        assert float(res.scores[s, copied]) > 5 * max(others)
    assert all(r is not None and r > 0.8 for r in res.fit["r2"])


def test_a_given_answer_is_kept_as_given_by_a_tokenizer_that_lowercases() -> None:
    """CONTRACT 9.1: tiny-lm's tokenizer lowercases, drops "!" and decodes words spaced apart
    ("alice lives in paris . bob <unk> old"); the answer comes back as given, its sentences cut
    in it, and each sentence still scores its own tokens."""
    model, tok = tiny_lm()
    answer = " Alice lives in Paris.  Bob is old!"
    res = methods.attribute_context(
        model, tok, "Alice lives in Paris. Bob lives in Rome.", "Where?", answer, n_ablations=8
    )
    assert res.answer == answer
    assert res.answer_sentences == ["Alice lives in Paris.", "Bob is old!"]
    assert res.answer_spans == [(1, 22), (24, 35)]
    assert [answer[a:b] for a, b in res.answer_spans] == res.answer_sentences
    assert res.answer_ids == tok.encode(answer, add_special_tokens=False)
    assert res.sentence_tokens == [(0, 5), (5, 8)]  # "alice lives in paris ." | "bob <unk> old"


def test_units_documents_paragraphs_and_a_pattern() -> None:
    docs = ["Alice works at the bank. Bob likes apples.", "The code is blue seven."]
    assert units.split(docs, "documents").parts == tuple(docs)
    assert units.split(docs, "sentences").parts == (
        "Alice works at the bank.", "Bob likes apples.", "The code is blue seven.",
    )  # fmt: skip
    para = units.split("One. Two.\n\nThree.\n \nFour", "paragraphs")
    assert para.parts == ("One. Two.", "Three.", "Four")
    assert para.join([True, False, True]) == "One. Two.\n \nFour"
    assert units.split("a; b;c", pattern=";").parts == ("a", "b", "c")
    assert units.sentences('Dr. Smith came. "Yes!" he said. J. Doe left') == [
        "Dr. Smith came.", '"Yes!"', "he said.", "J. Doe left",
    ]  # fmt: skip
    tok = bpe_tokenizer()
    res = methods.attribute_context(CopyLM(len(tok)), tok, docs, QUERY, ANSWER, units="documents")
    assert res.units == docs and res.scores.shape == (2, 2)


def test_a_generated_answer_is_the_model_s_greedy_answer_to_the_whole_prompt() -> None:
    tok = bpe_tokenizer()
    model = random_gpt2(len(tok))
    gen = methods.attribute_context(
        model, tok, CONTEXT, QUERY, gen_args={"max_new_tokens": 12}, n_ablations=16
    )
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": f"{CONTEXT}\n\n{QUERY}"}],
        tokenize=False, add_generation_prompt=True,
    )  # fmt: skip
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                          do_sample=False)[0, ids.shape[1]:].tolist()  # fmt: skip
    assert gen.answer_ids == [i for i in want if i != tok.eos_token_id][: len(gen.answer_ids)]
    assert gen.answer == tok.decode(gen.answer_ids)
    assert [gen.answer[a:b] for a, b in gen.answer_spans] == gen.answer_sentences
    assert gen.scores.shape == (len(gen.answer_sentences), 6)
    assert gen.params["gen_args"]["max_new_tokens"] == 12
    assert bool(torch.isfinite(gen.scores).all())


def test_the_prefix_cache_and_batching_change_no_number() -> None:
    tok = bpe_tokenizer(chat=False)
    model = random_gpt2(len(tok)).double()
    fast = methods.attribute_context(model, tok, CONTEXT, QUERY, ANSWER, n_ablations=24)
    slow = methods.attribute_context(
        model, tok, CONTEXT, QUERY, ANSWER, n_ablations=24, use_cache=False,
        perturbations_per_eval=1,
    )  # fmt: skip
    torch.testing.assert_close(fast.outputs, slow.outputs, rtol=1e-10, atol=1e-10)
    assert fast.params["chat_template"] is False
    assert fast.stats["tokens_from_cache"] > 0 and slow.stats["tokens_from_cache"] == 0
    assert slow.stats["max_prompts_per_forward"] == 1


@pytest.mark.parametrize(
    "kw, argument",
    [
        ({"context": "   "}, "context"),
        ({"context": [1, 2]}, "context"),
        ({"answer": "  "}, "answer"),
        ({"n_ablations": 4}, "n_ablations"),
        ({"keep_prob": 1.0}, "keep_prob"),
        ({"score": "prob"}, "score"),
        ({"alpha": 0}, "alpha"),
        ({"units": "words"}, "units"),
        ({"unit_pattern": "("}, "unit_pattern"),
        ({"unit_pattern": "x*"}, "unit_pattern"),
        ({"prompt_template": "{context}"}, "prompt_template"),
        ({"prompt_template": "{context} {query} {other}"}, "prompt_template"),
        ({"prompt_template": "{context {query}"}, "prompt_template"),
        ({"gen_args": {"max_new_tokens": 3}}, "gen_args"),
        ({"query": 3}, "query"),
        ({"perturbations_per_eval": 0}, "perturbations_per_eval"),
        ({"seed": -1}, "seed"),
    ],
)
def test_mistakes_name_their_argument(kw: dict[str, Any], argument: str) -> None:
    tok = bpe_tokenizer()
    args = {"context": CONTEXT, "query": QUERY, "answer": ANSWER, **kw}
    with pytest.raises(AttributionError) as err:
        methods.attribute_context(CopyLM(len(tok)), tok, **args)
    assert err.value.argument == argument


def test_a_context_longer_than_the_model_attends_to_is_refused() -> None:
    tok = bpe_tokenizer()
    model = random_gpt2(len(tok), positions=40)
    with pytest.raises(AttributionError) as err:
        methods.attribute_context(model, tok, CONTEXT, QUERY, ANSWER)
    assert "positions" in str(err.value)


def test_a_chat_template_that_refuses_the_prompt_names_the_template() -> None:
    tok = bpe_tokenizer()
    tok.chat_template = "{{ raise_exception('a system turn must come first') }}"
    with pytest.raises(AttributionError) as err:
        methods.attribute_context(CopyLM(len(tok)), tok, CONTEXT, QUERY, ANSWER)
    assert err.value.argument == "prompt_template"
    assert "system turn must come first" in str(err.value)
