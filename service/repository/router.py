"""The model repository (Triton's repository extension, so ``tritonclient``'s
``get_model_repository_index``, ``load_model`` and ``unload_model`` work): index, load, unload.

With API keys on, these routes take only an admin key (``ATTRSERVE_ADMIN_KEYS``). Errors are
problem+json with Triton's ``error`` member.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request

from service.compat.protocol import (
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryModel,
    RepositoryUnloadRequest,
)
from service.core.errors import Forbidden, MalformedRequest
from service.http.middleware import route_info
from service.http.openapi_doc import raw_body
from service.http.responses import OrjsonResponse
from service.http.state import AppState, get_state
from service.repository import serving
from service.wire.catalog import Problem
from service.wire.json import parse_json

router = APIRouter(tags=["repository"])
State = Annotated[AppState, Depends(get_state)]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "description": why}
    for code, why in (
        (400, "the load failed (the version before serves on), or a bad body"),
        (401, "no valid API key"),
        (403, "not an admin key"),
        (404, "no such model (in models.toml, for a load)"),
    )
}


async def _admin_body(state: AppState, request: Request) -> dict[str, Any]:
    """The body as a JSON object (empty: ``{}``), once the caller is known as an admin."""
    if not state.settings.is_admin(route_info(request.scope).get("api_key")):
        raise Forbidden(
            "the model repository takes only an admin key (one listed in ATTRSERVE_ADMIN_KEYS)"
        )
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = parse_json(raw)
    except ValueError as exc:
        raise MalformedRequest(f"the body is not valid JSON: {exc}", loc=("body",)) from None
    if not isinstance(body, dict):
        raise MalformedRequest("the body must be a JSON object", loc=("body",))
    return body


@router.post(
    "/v2/repository/index",
    operation_id="repositoryIndex",
    response_model=list[RepositoryModel],
    responses=ERRORS,
    openapi_extra=raw_body(RepositoryIndexRequest, "optional", required=False),
)
async def repository_index(state: State, request: Request) -> OrjsonResponse:
    """Every model the server knows, with Triton's state (READY, LOADING, UNAVAILABLE) and
    the reason (the load error, the crash, or "unloaded")."""
    body = await _admin_body(state, request)
    ready = body.get("ready", False)
    if not isinstance(ready, bool):
        raise MalformedRequest("ready must be true or false", loc=("body", "ready"))
    return OrjsonResponse(serving.index(state.pool, ready))


@router.post(
    "/v2/repository/models/{model_name}/load",
    operation_id="repositoryLoad",
    responses=ERRORS,
    openapi_extra=raw_body(RepositoryLoadRequest, "optional", required=False),
)
async def repository_load(model_name: str, state: State, request: Request) -> OrjsonResponse:
    """Serve the model as its models.toml entry says now: a changed or a new entry is served
    without a restart. The new version starts beside the one serving and replaces it once it
    is ready; a failed load (400, the error) leaves the version before serving."""
    body = await _admin_body(state, request)
    await serving.load(state.settings, state.pool, model_name, body)
    return OrjsonResponse({})


@router.post(
    "/v2/repository/models/{model_name}/unload",
    operation_id="repositoryUnload",
    responses=ERRORS,
    openapi_extra=raw_body(RepositoryUnloadRequest, "optional", required=False),
)
async def repository_unload(model_name: str, state: State, request: Request) -> OrjsonResponse:
    """Stop serving the model: requests in flight finish, later ones get 404 naming it as
    unloaded; its worker group stops once it serves no model."""
    await _admin_body(state, request)
    await serving.unload(state.pool, model_name)
    return OrjsonResponse({})
