"""``attrserve serve``: the HTTP app under uvicorn, shut down gracefully (also what
``attrserve explain-for`` runs, on the models.toml it writes)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.core.settings import Settings
    from service.http.server import GracefulServer


def serve(args: argparse.Namespace) -> None:
    from service.app import create_app
    from service.core.settings import Settings

    settings = Settings.from_env(host=args.host, port=args.port, models=args.models)
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
