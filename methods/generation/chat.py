"""A conversation as the prompt of a chat model: the messages through the tokenizer's own chat
template, each message (``"turns"``), each sentence of each message (``"sentences"``) or each
token (``"tokens"``) a feature.

The template is rendered once with a placeholder in each feature's place, and the placeholders
become ``{}`` slots of a ``str.format`` template. An ablated sentence is replaced by its
baseline (``""`` by default) while everything the chat template adds (role markers, the
system prompt's frame, the generation prompt) stays in place, as attribute_generation's
templates do. An ablated turn is removed from the messages, its role markers with it, and the
conversation left is rendered again, the generation prompt added (``TurnFeatures``).
"""

from __future__ import annotations

import re
from typing import Any

from methods.errors import InvalidArgumentError, InvalidTypeError
from methods.generation.features import TemplateFeatures, encode

FEATURES = ("turns", "sentences", "tokens")
#: where a sentence ends: after . ! or ? (and a closing quote or bracket) and white space
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def is_chat(prompt: object) -> bool:
    """Whether a prompt is a conversation (a list of messages) rather than a text."""
    return isinstance(prompt, list)


def check_messages(messages: Any) -> list[dict[str, str]]:
    """Each message a ``{"role": ..., "content": ...}`` of strings; at least one."""
    if not isinstance(messages, list) or not messages:
        raise InvalidTypeError(
            'messages must be a non-empty list of {"role": ..., "content": ...}',
            argument="messages",
        )
    for i, m in enumerate(messages):
        ok = isinstance(m, dict) and set(m) <= {"role", "content"}
        if not ok or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidTypeError(
                f'message {i} must be {{"role": <string>, "content": <string>}}, got {m!r}',
                argument="messages",
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def sentences(text: str) -> list[str]:
    """The text's sentences, each with the white space that follows it (they join back to the
    text)."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append(text[start : m.end()])
        start = m.end()
    if start < len(text):
        out.append(text[start:])
    return [s for s in out if s.strip()] or ([text] if text else [])


def kind(features: Any) -> str:
    """Which features of a conversation: ``"turns"`` (the default), ``"sentences"`` or
    ``"tokens"``."""
    if features is None:
        return "turns"
    if not isinstance(features, str) or features not in FEATURES:
        raise InvalidArgumentError(
            f"with messages, features is one of {list(FEATURES)}, got {features!r}",
            argument="features",
        )
    return features


def render(tokenizer: Any, messages: Any, features: Any = "turns") -> tuple[str, list[str] | None]:
    """The prompt attribute_generation takes: (a ``{}`` template, its slots' values), or
    (the rendered text, None) for ``features="tokens"`` (every token a feature)."""
    messages = check_messages(messages)
    features = kind(features)
    if not getattr(tokenizer, "chat_template", None) or not callable(
        getattr(tokenizer, "apply_chat_template", None)
    ):
        raise InvalidArgumentError(
            "the model's tokenizer has no chat template (tokenizer_config.json chat_template): "
            "send a prompt text instead of messages",
            argument="messages",
        )
    values: list[str] = []
    marked = []
    for m in messages:
        parts = [m["content"]] if features != "sentences" else sentences(m["content"])
        content = ""
        for part in parts:
            content += _mark(len(values))
            values.append(part)
        marked.append({"role": m["role"], "content": content})
    text = _apply(tokenizer, marked, "the messages")
    template = text.replace("{", "{{").replace("}", "}}")
    for i in range(len(values)):
        if template.count(_mark(i)) != 1:
            raise InvalidArgumentError(
                "the chat template does not place each message's content once; use "
                'features="tokens"',
                argument="features",
            )
        template = template.replace(_mark(i), "{}")
    if features == "tokens":
        return template.format(*values), None
    return template, values


def _mark(i: int) -> str:
    return f"\u0000slot{i}\u0000"


def _apply(tokenizer: Any, messages: list[dict[str, str]], what: str) -> str:
    """The conversation through the chat template, the generation prompt added."""
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template's own refusal (roles out of order, ...)
        raise InvalidArgumentError(
            f"the chat template refused {what}: {' '.join(str(exc).split())}",
            argument="messages",
        ) from None
    return str(text)


class TurnFeatures(TemplateFeatures):
    """Each message a feature. A conversation with some turns absent is the messages left,
    rendered again through the chat template (the generation prompt added): an ablated turn
    is removed with its role markers, not left as an empty turn; with none left, the prompt
    is the generation prompt alone (``_nothing``). A template that refuses a
    conversation without some turn (one that wants roles to alternate) is a clear error
    naming the turn; ``features="sentences"`` keeps every turn in place."""

    def __init__(self, tokenizer: Any, messages: Any, baselines: Any = None) -> None:
        if baselines is not None:
            raise InvalidArgumentError(
                'with features "turns" an ablated turn is removed from the messages: there is '
                'no baseline to give (features "sentences" replaces text by baselines)',
                argument="baselines",
            )
        template, values = render(tokenizer, messages, "turns")
        super().__init__(tokenizer, template, values)
        self.messages = check_messages(messages)

    def text(self, present: Any) -> str:
        if all(present):
            return super().text(present)  # the conversation as rendered once
        if not any(present):
            return self._nothing()
        kept = [m for m, on in zip(self.messages, present, strict=True) if on]
        gone = [i for i, on in enumerate(present) if not on]
        return _apply(self.tokenizer, kept, f"the conversation without turn(s) {gone}")

    def _nothing(self) -> str:
        """No turn at all (chat templates refuse an empty conversation): the generation
        prompt alone, what ``add_generation_prompt`` adds to the whole conversation; where
        that is no token, every turn left empty."""
        whole = super().text([True] * self.n)
        try:
            bare = self.tokenizer.apply_chat_template(
                self.messages, tokenize=False, add_generation_prompt=False
            )
        except Exception:  # it rendered with the prompt: this is not expected to fail
            bare = None
        if isinstance(bare, str) and whole.startswith(bare):
            prompt = whole[len(bare) :]
            if encode(self.tokenizer, prompt):
                return prompt
        return super().text([False] * self.n)
