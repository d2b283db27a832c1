"""What context attributions alone are limited by: ``ATTRSERVE_MAX_CONTEXT_TOKENS``,
``ATTRSERVE_MAX_CONTEXT_UNITS``, ``ATTRSERVE_MAX_ANSWER_TOKENS`` (each a 422 naming it)."""

from __future__ import annotations

from pydantic import Field

from service.core.settings import Section


class ContextSettings(Section):
    """The operation's own settings (``ContextAttributions.settings``)."""

    max_context_tokens: int = Field(
        default=4096,
        ge=1,
        description="most tokens of the prompt built from the whole context (422)",
    )
    max_context_units: int = Field(default=512, ge=1, description="most units of the context (422)")
    max_answer_tokens: int = Field(default=256, ge=1, description="most tokens of the answer (422)")
