"""uvicorn's server with a graceful drain in front of its shutdown."""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from service.pool.pool import WorkerPool


class GracefulServer(uvicorn.Server):
    """On SIGTERM: stop accepting, let in-flight work finish for ``drain_s``, then answer what
    is left with 503 problem+json (the pool does), so uvicorn has nothing left to cancel."""

    def __init__(self, config: uvicorn.Config, pool: WorkerPool, drain_s: float) -> None:
        super().__init__(config)
        self.pool = pool
        self.drain_s = drain_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        drain = asyncio.ensure_future(self.pool.drain(self.drain_s))
        try:
            await super().shutdown(sockets)
        finally:
            drain.cancel()
