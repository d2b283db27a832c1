"""orjson responses (numpy arrays serialised natively, without a Python list detour)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

from service.wire.json import OPTIONS


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=OPTIONS)


class ProblemResponse(OrjsonResponse):
    media_type = "application/problem+json"
