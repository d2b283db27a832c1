"""The ``attrserve`` command: ``serve``, ``openapi``, ``bench``."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from typing import Any

import orjson


def openapi_spec() -> dict[str, Any]:
    """The app's OpenAPI document (built without starting workers)."""
    from service.app import create_app
    from service.settings import Settings

    spec: dict[str, Any] = create_app(Settings(), start_workers=False).openapi()
    return spec


def openapi_text() -> str:
    options = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS
    return orjson.dumps(openapi_spec(), option=options).decode() + "\n"


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    from service.app import create_app
    from service.server import GracefulServer
    from service.settings import Settings

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
        access_log=False,  # ours (service.middleware) carries the request id, model and method
        timeout_keep_alive=settings.keep_alive_s,
        limit_concurrency=settings.max_concurrency,
        # uvicorn cancels what is still running after this; the pool answers first (503)
        timeout_graceful_shutdown=math.ceil(settings.drain_s) + 5,
    )
    GracefulServer(config, app.state.attrserve.pool, settings.drain_s).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="attrserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_serve = sub.add_parser("serve", help="serve the models over HTTP")
    p_serve.add_argument("--host", default=None, help="bind address (ATTRSERVE_HOST)")
    p_serve.add_argument("--port", type=int, default=None, help="port (ATTRSERVE_PORT)")
    p_serve.add_argument("--models", default=None, help="models.toml (ATTRSERVE_MODELS)")
    sub.add_parser("openapi", help="print the OpenAPI document")
    p_bench = sub.add_parser("bench", help="run the HTTP load benchmark")
    p_bench.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "serve":
        serve(args)
    elif args.command == "openapi":
        sys.stdout.write(openapi_text())
    else:
        from benchmarks import load

        load.main(args.rest)


if __name__ == "__main__":
    main()
