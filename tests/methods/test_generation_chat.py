"""A conversation as the prompt (``attribute_generation(prompt=[messages])``): rendered by the
tokenizer's chat template, each message, sentence or token a feature, equal to the same
template written by hand."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

import methods
from methods.errors import AttributionError
from methods.generation import chat
from tests.methods.test_generation import gpt2, gpt2_tokenizer

TEMPLATE = (
    "{% for m in messages %}<bos> {{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}said {% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "alice lives in paris. bob lives in rome."},
    {"role": "user", "content": "where is my friend alice"},
]


@functools.cache
def chat_tokenizer() -> Any:
    tok = copy.deepcopy(gpt2_tokenizer())
    tok.chat_template = TEMPLATE
    return tok


def test_each_message_is_a_feature_removed_from_the_conversation_when_ablated() -> None:
    """CONTRACT 8.3: an ablated turn is removed from messages (its role markers with it) and
    the generation prompt is added to what is left."""
    template, values = chat.render(chat_tokenizer(), MESSAGES)
    assert values == [m["content"] for m in MESSAGES]
    assert template == "<bos> system : {} <bos> user : {} said "
    ours = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris")
    assert ours.input_tokens == values and ours.seq_attr.shape == (2,)

    def log_prob(text: str) -> torch.Tensor:
        res = methods.attribute_generation(gpt2(), chat_tokenizer(), text, target="paris",
                                           method="feature_ablation", features=None)  # fmt: skip
        return res.output_log_probs.sum()

    full = log_prob(template.format(*values))
    without = ["<bos> user : where is my friend alice said ",
               "<bos> system : alice lives in paris. bob lives in rome. said "]  # fmt: skip
    for i, text in enumerate(without):
        torch.testing.assert_close(ours.seq_attr[i], full - log_prob(text), rtol=1e-6, atol=1e-9)
    # not the turn left empty: that keeps its role markers
    emptied = log_prob(template.format("", values[1]))
    assert abs(float(ours.seq_attr[0] - (full - emptied))) > 1e-4
    # every coalition of a sampling method is a conversation of the turns it keeps
    shap = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris",
                                        method="shapley_values")  # fmt: skip
    nothing = log_prob("said ")
    torch.testing.assert_close(shap.seq_attr.sum(), full - nothing, rtol=1e-5, atol=1e-7)


def test_a_removed_turn_has_no_baseline_and_a_refusing_template_names_the_turn() -> None:
    with pytest.raises(AttributionError) as e:
        methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris",
                                     baselines=["x", "y"])  # fmt: skip
    assert e.value.argument == "baselines" and "removed" in str(e.value)
    strict = copy.deepcopy(chat_tokenizer())
    strict.chat_template = (
        "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}{% endif %}"
        + TEMPLATE
    )
    with pytest.raises(AttributionError) as e:
        methods.attribute_generation(gpt2(), strict, MESSAGES, target="paris")
    assert e.value.argument == "messages" and "without turn(s) [0]" in str(e.value)
    assert "system first" in str(e.value)


def test_sentences_and_tokens() -> None:
    template, values = chat.render(chat_tokenizer(), MESSAGES, "sentences")
    assert values == ["alice lives in paris. ", "bob lives in rome.", "where is my friend alice"]
    assert template.format(*values) == chat.render(chat_tokenizer(), MESSAGES, "tokens")[0]
    res = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris",
                                       features="sentences")  # fmt: skip
    assert res.input_tokens == values and res.seq_attr.shape == (3,)
    tokens = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris",
                                          features="tokens", method="saliency")  # fmt: skip
    text, _ = chat.render(chat_tokenizer(), MESSAGES, "tokens")
    plain = methods.attribute_generation(gpt2(), chat_tokenizer(), text, target="paris",
                                         method="saliency")  # fmt: skip
    torch.testing.assert_close(tokens.token_attr, plain.token_attr)


@pytest.mark.parametrize(
    ("prompt", "kw", "argument"),
    [
        (MESSAGES, {"tokenizer": "plain"}, "messages"),
        ([], {}, "messages"),
        ([{"role": "user"}], {}, "messages"),
        ([{"role": "user", "content": 3}], {}, "messages"),
        (MESSAGES, {"features": "words"}, "features"),
        ("a text prompt", {"features": "turns"}, "features"),
    ],
)
def test_mistakes_name_their_argument(prompt: Any, kw: dict[str, Any], argument: str) -> None:
    tok = gpt2_tokenizer() if kw.pop("tokenizer", None) == "plain" else chat_tokenizer()
    with pytest.raises(AttributionError) as info:
        methods.attribute_generation(gpt2(), tok, prompt, target="paris", **kw)
    assert info.value.argument == argument
