"""Request headers the routes share, each declared once: ``X-Deadline-Ms``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Header
from pydantic import Field, TypeAdapter, ValidationError

from service.core.errors import InvalidRequest

DEADLINE_HEADER = "x-deadline-ms"
_DESCRIPTION = "deadline in ms (overrides the body's)"
#: a route's ``X-Deadline-Ms`` parameter (FastAPI: a 422 naming the header when not > 0)
Deadline = Annotated[float | None, Header(gt=0, description=_DESCRIPTION)]
_DEADLINE = TypeAdapter(Annotated[float | None, Field(gt=0)])


def deadline(raw: str | None) -> float | None:
    """The header's value as the routes read it (None when absent); a 422 naming the header
    when it is not a positive number (routes that read their headers themselves)."""
    try:
        return _DEADLINE.validate_python(raw)
    except ValidationError:
        raise InvalidRequest(
            "X-Deadline-Ms must be a positive number", loc=("header", DEADLINE_HEADER)
        ) from None
