"""JSON on the wire: bodies parsed with orjson (several times faster than the stdlib on tensor
lists), and the options responses are written with.

Bodies orjson rejects are parsed again with the stdlib, so what the API accepts and how it
reports bad JSON do not change (NaN/Infinity literals, huge ints, the stdlib's error positions).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from service.core.errors import WHERE, InvalidRequest

#: the deepest JSON taken (orjson's limit; a tensor of any rank nests far less)
MAX_DEPTH = 1024
#: numpy arrays serialised natively, without a Python list detour
OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def parse_json(body: bytes) -> Any:
    """The body as JSON; raises ``json.JSONDecodeError`` (bad JSON) or ``InvalidRequest`` (a
    string that is not Unicode: a lone surrogate escape such as ``"\\ud800"``)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(body)
        except RecursionError:  # orjson stops at 1024 levels, the stdlib recurses until this
            raise json.JSONDecodeError(
                f"the JSON nests deeper than {MAX_DEPTH} levels", "", 0
            ) from None
    where = _lone_surrogate(data, ("body",))
    if where is not None:
        raise InvalidRequest(
            f"{WHERE} holds a lone UTF-16 surrogate escape, "
            "which is not a Unicode character; send valid UTF-8 text",
            loc=where,
        )
    return data


def _lone_surrogate(value: Any, loc: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return loc
        return None
    if isinstance(value, list):
        items: Any = enumerate(value)
    elif isinstance(value, dict):
        for key in value:
            if _lone_surrogate(key, loc) is not None:
                return loc
        items = value.items()
    else:
        return None
    for k, v in items:
        found = _lone_surrogate(v, (*loc, k))
        if found is not None:
            return found
    return None
