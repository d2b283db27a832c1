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


def test_each_message_is_a_feature_as_a_hand_written_template_makes_it() -> None:
    template, values = chat.render(chat_tokenizer(), MESSAGES)
    assert values == [m["content"] for m in MESSAGES]
    assert template == "<bos> system : {} <bos> user : {} said "
    ours = methods.attribute_generation(gpt2(), chat_tokenizer(), MESSAGES, target="paris")
    by_hand = methods.attribute_generation(gpt2(), chat_tokenizer(), template, target="paris",
                                           features=values)  # fmt: skip
    assert ours.input_tokens == values
    torch.testing.assert_close(ours.seq_attr, by_hand.seq_attr)
    # ablating the system turn is the answer's log-probability without its content
    full = methods.attribute_generation(gpt2(), chat_tokenizer(), template.format(*values),
                                        target="paris", method="feature_ablation",
                                        features=None)  # fmt: skip
    without = template.format("", values[1])
    gone = methods.attribute_generation(gpt2(), chat_tokenizer(), without, target="paris",
                                        features=None)  # fmt: skip
    want = full.output_log_probs.sum() - gone.output_log_probs.sum()
    torch.testing.assert_close(ours.seq_attr[0], want, rtol=1e-6, atol=1e-9)


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
