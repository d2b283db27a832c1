"""``/docs`` (Swagger UI) and ``/redoc`` from files installed with the package, not a CDN: the
API's own documentation works on a machine without internet. The assets come from
fastapi-offline's package data (Swagger UI 5, which renders OpenAPI 3.1, and ReDoc)."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse
from starlette.routing import Route

from service.http.routing import OPEN, declare

ASSETS = Path(fastapi_offline.__file__).parent / "static"
PREFIX = "/docs/assets"


def install(app: FastAPI) -> None:
    """The documentation routes, all open without a key (FastAPI's own ``/openapi.json`` too)."""
    app.mount(PREFIX, declare(OPEN)(StaticFiles(directory=ASSETS)), name="docs-assets")
    title = f"{app.title} {app.version}"
    for route in app.routes:
        if isinstance(route, Route) and route.path == app.openapi_url:
            declare(OPEN)(route.endpoint)

    @app.get("/docs", include_in_schema=False)
    @declare(OPEN)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=title,
            swagger_js_url=f"{PREFIX}/swagger-ui-bundle.js",
            swagger_css_url=f"{PREFIX}/swagger-ui.css",
            swagger_favicon_url=f"{PREFIX}/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False)
    @declare(OPEN)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=title,
            redoc_js_url=f"{PREFIX}/redoc.standalone.js",
            redoc_favicon_url=f"{PREFIX}/favicon.png",
            with_google_fonts=False,
        )
