"""``attrserve serve``: the HTTP app under uvicorn, shut down gracefully (also what
``attrserve explain-for`` runs, on the models.toml it writes)."""

from __future__ import annotations

import argparse
import errno
import logging
import math
import socket
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.core.settings import Settings
    from service.http.server import GracefulServer


def serve(args: argparse.Namespace) -> None:
    from service.core.settings import Settings

    settings = Settings.from_env(host=args.host, port=args.port, models=args.models)
    check_address(settings.host, settings.port)  # before torch is imported or a worker starts

    from service.app import create_app

    level = logging.getLevelName(settings.log_level.upper())  # uvicorn's "trace" is not one
    logging.basicConfig(
        level=level if isinstance(level, int) else logging.DEBUG, format="%(message)s"
    )
    server = server_for(create_app(settings), settings)
    server.run()
    if not server.started:  # the start failed (ATTRSERVE_STRICT_START, a port in use)
        sys.exit(3)


def server_for(app: Any, settings: Settings, *, keep_logging: bool = False) -> GracefulServer:
    """uvicorn's server of ``app`` as ``attrserve serve`` runs it; ``keep_logging`` leaves
    logging as the calling process set it (the tests' apps in a thread), not uvicorn's."""
    import uvicorn

    from service.http.server import GracefulServer

    logs: dict[str, Any] = {"log_config": None} if keep_logging else {}
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        **logs,
        access_log=False,  # ours (service.http.middleware) carries the request id, model and method
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_concurrency,
        timeout_graceful_shutdown=math.ceil(settings.drain_s) + 5,
    )
    return GracefulServer(config, app.state.attrserve.pool, settings.drain_s)


def check_address(host: str, port: int) -> None:
    """Exit (status 3) naming ``host:port`` where it cannot be listened on: a port another
    process holds, an address not this machine's. uvicorn binds only after the lifespan has
    started every worker and loaded every model, so it would report ``[Errno 98]`` a minute
    in; this binds as asyncio's ``create_server`` then will (every address ``host`` resolves
    to, ``SO_REUSEADDR``, IPv6 only on IPv6) and lets go at once."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in found:
            try:
                made = socket.socket(family, kind, proto)
            except OSError:  # a family this machine lacks (IPv6 compiled out): asyncio skips it
                continue
            with made as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except OSError as exc:  # socket.gaierror included: a host name that does not resolve
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            why += " (another process listens there: stop it, or choose --port / ATTRSERVE_PORT)"
        sys.stderr.write(f"attrserve serve: error: cannot listen on {where}: {why}\n")
        sys.exit(3)
