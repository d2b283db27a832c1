"""Body size limit as pure ASGI middleware: 413 before the body is parsed or buffered whole."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import BodyTooLarge
from service.http.problems import problem
from service.http.routing import found


class BodyLimit:
    """``max_bytes`` for every route; ``job_bytes`` for the routes that declare job bodies
    (``Policy.job_body``: job submissions take larger bodies)."""

    def __init__(self, app: ASGIApp, max_bytes: int, job_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.job_bytes = job_bytes

    def limit(self, scope: Scope) -> int:
        return self.job_bytes if found(scope).policy.job_body else self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit(scope)
        err = BodyTooLarge(f"the request body is over the limit of {max_bytes} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
                await problem(err, scope.get("path"))(scope, receive, send)
                return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise err
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracking_send)
        except BodyTooLarge as exc:
            if started:
                raise
            await problem(exc, scope.get("path"))(scope, receive, send)
