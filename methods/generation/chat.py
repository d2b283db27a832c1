"""A conversation as the prompt of a chat model: the messages through the tokenizer's own chat
template, each message (``"turns"``), each sentence of each message (``"sentences"``) or each
token (``"tokens"``) a feature.

The template is rendered once with a placeholder in each feature's place, and the placeholders
become ``{}`` slots of a ``str.format`` template: everything the chat template adds (role
markers, the system prompt's frame, the generation prompt) stays in place while a feature is
ablated (its text replaced by the baseline, ``""`` by default), as attribute_generation's
templates do.
"""

from __future__ import annotations

import re
from typing import Any

from methods.errors import InvalidArgumentError, InvalidTypeError

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


def render(tokenizer: Any, messages: Any, features: Any = "turns") -> tuple[str, list[str] | None]:
    """The prompt attribute_generation takes: (a ``{}`` template, its slots' values), or
    (the rendered text, None) for ``features="tokens"`` (every token a feature)."""
    messages = check_messages(messages)
    if features is None:
        features = "turns"
    if not isinstance(features, str) or features not in FEATURES:
        raise InvalidArgumentError(
            f"with messages, features is one of {list(FEATURES)}, got {features!r}",
            argument="features",
        )
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
    try:
        text = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # the template's own refusal (roles out of order, ...)
        raise InvalidArgumentError(
            f"the chat template refused the messages: {' '.join(str(exc).split())}",
            argument="messages",
        ) from None
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
