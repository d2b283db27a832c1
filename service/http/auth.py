"""Optional API keys: 401 without a valid key, 403 for a model outside the key's list.
Admin keys (``ATTRSERVE_ADMIN_KEYS``) are valid on every route.

Checked by ``service.http.middleware.ApiKeys`` from the headers alone, before any body is read.
"""

from __future__ import annotations

from starlette.datastructures import Headers

from service.core.errors import Forbidden, Unauthorized
from service.core.settings import ApiKey, Settings


def presented_key(headers: Headers) -> str | None:
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return headers.get("x-api-key")


def authenticate(settings: Settings, headers: Headers) -> ApiKey | None:
    """The matching key (None when the server has no keys); raises 401 otherwise."""
    if not settings.keys:
        return None
    given = presented_key(headers)
    if given:
        # every key is compared (in constant time each): no early exit to time
        found = [k for k in settings.keys if k.matches(given)]
        if found:
            return found[0]
    raise Unauthorized(
        "a valid API key is required (Authorization: Bearer <key> or X-API-Key)",
        headers={"WWW-Authenticate": "Bearer"},
    )


def authorize(key: ApiKey | None, model_id: str, settings: Settings) -> None:
    if key is not None and key not in settings.admin_keys and not key.allows(model_id):
        raise Forbidden(f"this API key may not use model {model_id!r}")
