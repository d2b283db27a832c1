"""The one router: each route is declared once, in its FastAPI declaration, with what the layers
around FastAPI need to know of it (its ``Policy``: whether it needs an API key, which body limit
it takes, a fast handler); ``RouteTable`` finds a request's route the way Starlette does (the
same routes, in the same order, by their own ``matches``), once per request, so the key check,
the body limit, span names and the fast path all read the route FastAPI would serve, never a
pattern copied from its path.

Also here: the FastAPI route class whose bodies are parsed by ``service.wire.json`` (orjson).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import fastapi.routing
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.offload import large, offload_if
from service.wire.json import parse_json

#: a route's fast handler: ``(state, fallback, params, scope, receive, send)``; it answers the
#: request itself or hands it to ``fallback`` (FastAPI) with the body replayed
FastHandler = Callable[[Any, ASGIApp, dict[str, str], Scope, Receive, Send], Awaitable[None]]
E = TypeVar("E")


@dataclass(frozen=True)
class Policy:
    """What a route declares beyond FastAPI's own declaration."""

    #: an API key is needed (when the server has keys); a route with a ``model_id`` path
    #: parameter also needs a key that may use that model
    keyed: bool = True
    #: takes bodies up to ``max_job_body_bytes`` (job submissions), not ``max_body_bytes``
    job_body: bool = False
    #: served without FastAPI's machinery where it can (``service.attributions.fastpath``)
    fast: FastHandler | None = field(default=None, compare=False)


DEFAULT = Policy()
#: routes open without a key: health, server metadata, metrics, the API's documentation and
#: the explorer's page and files (it asks for the key itself)
OPEN = Policy(keyed=False)
ATTRIBUTE = "route_policy"


def declare(policy: Policy) -> Callable[[E], E]:
    """Mark an endpoint (or a mounted app) with its route's policy."""

    def mark(endpoint: E) -> E:
        setattr(endpoint, ATTRIBUTE, policy)
        return endpoint

    return mark


def policy_of(route: BaseRoute | None) -> Policy:
    """A route's declared policy (``DEFAULT`` where it declares none)."""
    if route is None:
        return DEFAULT
    target = getattr(route, "endpoint", None) or getattr(route, "app", None)
    policy = getattr(target, ATTRIBUTE, DEFAULT)
    return policy if isinstance(policy, Policy) else DEFAULT


@dataclass(frozen=True)
class Found:
    """The route a request is for (None: no route has its path) and its path parameters;
    ``full``: the route takes the request's HTTP method too."""

    route: BaseRoute | None
    params: dict[str, str]
    full: bool
    policy: Policy

    @property
    def template(self) -> str | None:
        """The route's path template (a span's name), e.g. ``/v1/models/{model_id}``."""
        path = getattr(self.route, "path", None)
        return path if isinstance(path, str) else None


NOT_FOUND = Found(None, {}, False, DEFAULT)


class RouteTable:
    """A request's route, found as Starlette's router finds it: the first route that takes
    its path and method, else the first that takes its path, else the route its path names
    with or without a trailing slash (which Starlette answers with a redirect). Answers are
    remembered per method and path (a bounded LRU: model ids make paths many)."""

    def __init__(self, routes: Sequence[BaseRoute], cache: int = 4096) -> None:
        self.routes = flat(routes)
        self.cache_size = cache
        self._cache: OrderedDict[tuple[str, str, str], Found] = OrderedDict()

    def find(self, scope: Scope) -> Found:
        key = (scope["method"], scope.get("root_path", ""), scope["path"])
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
            return found
        found = self._match(scope)
        if found is NOT_FOUND:
            path = scope["path"]
            other = path[:-1] if path.endswith("/") and path != "/" else path + "/"
            redirected = self._match({**scope, "path": other})  # answered by a redirect
            found = Found(redirected.route, redirected.params, False, redirected.policy)
        self._cache[key] = found
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return found

    def _match(self, scope: Scope) -> Found:
        partial: Found | None = None
        for route in self.routes:
            match, child = route.matches(scope)
            if match is Match.NONE:
                continue
            params = {k: str(v) for k, v in child.get("path_params", {}).items()}
            if match is Match.FULL:
                return Found(route, params, True, policy_of(route))
            if partial is None:
                partial = Found(route, params, False, policy_of(route))
        return partial or NOT_FOUND

    def policies(self) -> dict[str, Policy]:
        """Each route's path template and its policy (the OpenAPI document's security)."""
        return {
            path: policy_of(route)
            for route in self.routes
            if isinstance(path := getattr(route, "path", None), str)
        }


def flat(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """The routes in the order the app matches them, included routers opened (FastAPI 0.120
    and later keep each included router as one route; earlier ones copy its routes in)."""
    contexts = getattr(fastapi.routing, "iter_route_contexts", None)
    if contexts is None:
        return list(routes)
    out = []
    for context in contexts(routes):
        route = context.original_route
        if getattr(route, "path", None) != context.path:
            raise ValueError(  # a prefix would need the matching FastAPI does with it
                f"route {context.path!r} is mounted under a prefix; mount routers without one"
            )
        out.append(route)
    return out


def route_info(scope: Scope) -> dict[str, Any]:
    """Where a request's route, and what the access log reports (model, method), are kept."""
    state: dict[str, Any] = scope.setdefault("state", {})
    info: dict[str, Any] = state.setdefault("attrserve", {})
    return info


def found(scope: Scope) -> Found:
    """The request's route, as the request context found it on the way in
    (``service.http.middleware.RequestContext``; ``NOT_FOUND`` without a route table)."""
    route: Found = route_info(scope).get("route", NOT_FOUND)
    return route


# -- fast handlers: a raw body, read and replayed ---------------------------------------------
async def read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The messages read and the whole body; None for the body if the client went away."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A receive that gives back the messages already read, then reads on."""
    pending = deque(messages)

    async def replayed() -> Message:
        return pending.popleft() if pending else await receive()

    return replayed


#: a raw route's handler over the body's bytes (KServe and OIP: ``service.compat.router``)
RawHandler = Callable[[Any, Request, dict[str, str], bytes], Awaitable[Response]]


def raw(handler: RawHandler) -> FastHandler:
    """A fast handler that gives the whole body to ``handler``, which answers everything
    (errors included): the route's FastAPI endpoint calls the same handler."""

    async def fast(
        state: Any,
        fallback: ASGIApp,
        params: dict[str, str],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        _, body = await read_body(receive)
        if body is None:  # the client went away before sending its body
            return
        response = await handler(state, Request(scope, receive), params, body)
        await response(scope, receive, send)

    return fast


# -- bodies parsed by orjson --------------------------------------------------------------------
class OrjsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            self._json = await offload_if(large(len(body)), parse_json, body)
        return self._json


class OrjsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return route
