"""The inputs of a generation request, checked in the server without the model: a prompt text
(a ``{}`` template with its slots' values, or every token a feature), or a conversation
(``messages``, rendered by the model's chat template in the worker)."""

from __future__ import annotations

from string import Formatter
from typing import Any

from methods.errors import AttributionError
from methods.generation import chat
from service.core.errors import InvalidRequest, Loc

INPUT_KEYS = ("prompt", "messages", "features", "baselines", "skip_tokens")


def parse(raw: Any) -> dict[str, Any]:
    loc = ("body", "inputs")
    if not isinstance(raw, dict):
        raise InvalidRequest(
            'a causal language model takes "inputs": {"prompt": "...", "features": [...], '
            '"baselines": [...]} (features and baselines optional)',
            loc=loc,
        )
    unknown = sorted(set(raw) - set(INPUT_KEYS))
    if unknown:
        raise InvalidRequest(
            f"unknown key(s) {unknown} in inputs; expected {list(INPUT_KEYS)}",
            loc=(*loc, unknown[0]),
        )
    if "messages" in raw:
        return _chat_inputs(raw)
    prompt = raw.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest(
            "inputs.prompt must be a string (or give inputs.messages, a conversation)",
            loc=(*loc, "prompt"),
        )
    features = raw.get("features")
    if features is not None and not (
        (isinstance(features, list) and all(isinstance(v, str) for v in features))
        or (isinstance(features, dict) and all(isinstance(v, str) for v in features.values()))
    ):
        raise InvalidRequest(
            "inputs.features must be a list of strings (one per {} slot of the prompt), an "
            "object of strings (named {slots}), or null (every prompt token is a feature)",
            loc=(*loc, "features"),
        )
    if features is not None:
        check_template(prompt, features)
    skip = raw.get("skip_tokens")
    if skip is not None and not (
        isinstance(skip, list)
        and all(isinstance(t, (str, int)) and not isinstance(t, bool) for t in skip)
    ):
        raise InvalidRequest(
            "inputs.skip_tokens must be a list of tokens or token ids", loc=(*loc, "skip_tokens")
        )
    return {k: raw.get(k) for k in INPUT_KEYS if k != "messages"}


def _chat_inputs(raw: dict[str, Any]) -> dict[str, Any]:
    """``inputs.messages`` (a conversation through the model's chat template) with
    ``features`` "turns", "sentences" or "tokens": the prompt is the messages, rendered in the
    worker, which has the tokenizer."""
    loc: Loc = ("body", "inputs")
    if "prompt" in raw:
        raise InvalidRequest(
            "give inputs.prompt or inputs.messages, not both", loc=(*loc, "prompt")
        )
    try:
        messages = chat.check_messages(raw["messages"])
    except AttributionError as exc:
        raise InvalidRequest(str(exc), loc=(*loc, "messages")) from None
    features = raw.get("features") or "turns"
    if features not in chat.FEATURES:
        raise InvalidRequest(
            f"with inputs.messages, inputs.features is one of {list(chat.FEATURES)}",
            loc=(*loc, "features"),
        )
    if raw.get("skip_tokens") is not None and features != "tokens":
        raise InvalidRequest(
            'inputs.skip_tokens apply to features = "tokens"', loc=(*loc, "skip_tokens")
        )
    return {
        "prompt": messages,
        "features": features,
        "baselines": raw.get("baselines"),
        "skip_tokens": raw.get("skip_tokens"),
    }


def check_template(prompt: str, features: list[str] | dict[str, str]) -> None:
    """A template's slots are plain: ``{}`` (features a list) or ``{name}`` (an object); a
    format spec, conversion, attribute or index could make formatting run away (a width of
    ``{:>999999999}`` is a gigabyte), and is refused before any work."""
    loc = ("body", "inputs", "prompt")
    try:
        slots = [(f, spec, conv) for _, f, spec, conv in Formatter().parse(prompt) if f is not None]
    except ValueError as exc:
        raise InvalidRequest(
            f"inputs.prompt is not a template: {exc} (write a literal brace as {{{{ or }}}})",
            loc=loc,
        ) from None
    named = isinstance(features, dict)
    for name, spec, conv in slots:
        plain = (name.isidentifier() and name in features) if named else name == ""
        if spec or conv or not plain:
            want = "{name} slots named by inputs.features" if named else "plain {} slots"
            shown = "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            raise InvalidRequest(
                f"inputs.prompt slot {shown[:40]!r} is not allowed: the prompt takes {want} "
                "only (no format spec, conversion, index or attribute)",
                loc=loc,
            )
