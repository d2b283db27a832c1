"""FastAPI routes whose request bodies are parsed by ``service.wire.json`` (orjson)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from service.core.offload import OFFLOAD_BYTES, offload
from service.wire.json import parse_json


class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > OFFLOAD_BYTES:
                self._json = await offload(parse_json, body)
            else:
                self._json = parse_json(body)
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return route
