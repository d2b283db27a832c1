"""The explorer (CONTRACT 7.6): ``GET /ui``, a page served from package files that uses only the
public API, and ``POST /v1/uploads`` / ``GET /v1/uploads/{upload_id}``, where it keeps an image
a person gave it (so a link to the page names the image, short-lived, instead of inlining it).

The page and its files are open (no key): the page asks for the key and sends it with each API
call. Its Content-Security-Policy lets it reach its own origin only."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response

from service.core.offload import offload
from service.explorer import uploads
from service.http.responses import OrjsonResponse
from service.http.routing import OPEN, OrjsonRoute, declare
from service.http.state import AppState, get_state
from service.serving import render
from service.wire.catalog import Problem

router = APIRouter(tags=["explorer"], route_class=OrjsonRoute)
State = Annotated[AppState, Depends(get_state)]
#: the page's files and their media types
FILES = {
    "index.html": "text/html; charset=utf-8",
    "explorer.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "draw.js": "text/javascript; charset=utf-8",
    "change.js": "text/javascript; charset=utf-8",
    "concepts.js": "text/javascript; charset=utf-8",
    "influence.js": "text/javascript; charset=utf-8",
    "colormaps.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; "
    "style-src 'self'; script-src 'self'; connect-src 'self'; base-uri 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


#: the page's colormaps by its names (its links keep them), each one of the API pictures'
#: (render.COLORMAPS): one table, so that the page and a rendered PNG colour a score alike
COLORMAPS = {"redblue": "rdbu", "viridis": "viridis", "grays": "greys"}


@cache
def _file(name: str) -> bytes:
    """One of the page's files, read once (they are package data, but for colormaps.js)."""
    if name == "colormaps.js":
        return _colormaps()
    return resources.files("service.explorer").joinpath("page", name).read_bytes()


def _colormaps() -> bytes:
    """colormaps.js: the anchors of the page's colormaps and which are diverging, from
    :data:`render.COLORMAPS`."""
    table = {page: render.COLORMAPS[ours] for page, ours in COLORMAPS.items()}
    anchors = {page: hexes.split() for page, (_, hexes) in table.items()}
    diverging = {page: flag for page, (flag, _) in table.items()}
    return (
        "// made by service/explorer/router.py from service/serving/render.py (COLORMAPS)\n"
        f"export const ANCHORS = {json.dumps(anchors)};\n"
        f"export const DIVERGING = {json.dumps(diverging)};\n"
    ).encode()


@router.get("/ui", include_in_schema=False)
@declare(OPEN)
async def page() -> Response:
    return Response(_file("index.html"), media_type=FILES["index.html"], headers=HEADERS)


@router.get("/ui/{name}", include_in_schema=False)
@declare(OPEN)
async def asset(name: str) -> Response:
    if name not in FILES:
        return Response(status_code=404)
    return Response(_file(name), media_type=FILES[name], headers=HEADERS)


#: declared as bytes: client generators take no image/* range (the served type is the file's)
BYTES = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such upload (or it expired)"},
    413: {"model": Problem, "description": "body over the limit"},
    422: {"model": Problem, "description": "not a PNG, JPEG or WebP file"},
}


@router.post(
    "/v1/uploads",
    operation_id="upload",
    status_code=201,
    responses=UPLOAD_ERRORS,
    openapi_extra={
        "requestBody": {
            "required": True,
            "description": "a PNG, JPEG or WebP file's bytes (the type is read from them)",
            "content": BYTES,
        }
    },
)
async def upload(state: State, request: Request) -> OrjsonResponse:
    """Keep an image (the body: a PNG, JPEG or WebP file) for an hour; its id names it in
    ``GET /v1/uploads/{upload_id}`` (the explorer keeps the id in its link)."""
    data = await request.body()
    saved = await offload(uploads.save, state.settings, data)
    where = {"Location": f"/v1/uploads/{saved['id']}"}
    return OrjsonResponse(saved, status_code=201, headers=where)


@router.get(
    "/v1/uploads/{upload_id}",
    operation_id="getUpload",
    response_class=Response,
    responses={
        200: {
            "description": "the file (served as image/png, image/jpeg or image/webp)",
            "content": BYTES,
        },
        **UPLOAD_ERRORS,
    },
)
async def get_upload(upload_id: str, state: State) -> Response:
    """An uploaded image, as it was given."""
    data, kind = await offload(uploads.load, state.settings, upload_id)
    return Response(data, media_type=kind, headers={"Cache-Control": "private, max-age=3600"})
