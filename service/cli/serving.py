"""``attrserve serve``: the HTTP app under uvicorn, shut down gracefully (also what
``attrserve explain-for`` runs, on the models.toml it writes)."""

from __future__ import annotations

import argparse
import logging
import math
import sys


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from service.app import create_app
    from service.core.settings import Settings
    from service.http.server import GracefulServer

    settings = Settings.from_env(host=args.host, port=args.port, models=args.models)
    level = logging.getLevelName(settings.log_level.upper())  # uvicorn's "trace" is not one
    logging.basicConfig(
        level=level if isinstance(level, int) else logging.DEBUG, format="%(message)s"
    )
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # ours (service.http.middleware) carries the request id, model and method
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_concurrency,
        # uvicorn cancels what is still running after this; the pool answers first (503)
        timeout_graceful_shutdown=math.ceil(settings.drain_s) + 5,
    )
    server = GracefulServer(config, app.state.attrserve.pool, settings.drain_s)
    server.run()
    if not server.started:  # the start failed (ATTRSERVE_STRICT_START, a port in use)
        sys.exit(3)
