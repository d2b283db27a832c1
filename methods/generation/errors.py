"""Typed errors of ``methods.attribute_generation``; each names the argument at fault.

They extend the engine's hierarchy (``methods.errors``), so a caller catching
``AttributionError`` / ``ValueError`` catches these too, and the service maps them to a 422
whose ``loc`` is the argument.
"""

from __future__ import annotations

from methods.errors import InvalidArgumentError, UnsupportedModelError


class EmptyPromptError(InvalidArgumentError):
    """The prompt has no text, or no token left to attribute to (``argument="prompt"``)."""


class TemplateMismatchError(InvalidArgumentError):
    """The template's ``{}`` slots and the ``features`` (or ``baselines``) do not match."""


class TargetTooLongError(InvalidArgumentError):
    """Prompt plus target (or ``max_new_tokens``) exceed what the model can attend to."""


class EmptyTargetError(InvalidArgumentError):
    """The target text has no tokens (``argument="target"``)."""


class UnsupportedGenerationMethodError(InvalidArgumentError):
    """The method cannot attribute a generated answer (or not with this kind of prompt)."""


class UnsupportedLanguageModelError(UnsupportedModelError):
    """The model is neither a Hugging Face causal LM, an attrserve KV model, nor a callable
    ``ids -> logits``."""
