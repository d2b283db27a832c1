"""GET /v1/models, /v1/models/{model_id}, /v1/methods."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from service.catalog import serving
from service.http.middleware import route_info
from service.http.state import AppState, get_state
from service.wire.catalog import MethodList, ModelInfo, ModelList, method_list

router = APIRouter(tags=["catalog"])
State = Annotated[AppState, Depends(get_state)]


@router.get("/v1/models", response_model=ModelList, operation_id="listModels")
async def list_models(state: State, request: Request) -> ModelList:
    """Every served model (those the API key may use)."""
    key = route_info(request.scope).get("api_key")
    admin = state.settings.is_admin(key)
    states, loaded = state.pool.states(), state.pool.model_info
    infos = [
        _with_influence(state, serving.model_info(s, loaded.get(s.id), states[s.id]))
        for s in state.specs.values()
        if key is None or admin or key.allows(s.id)
    ]
    return ModelList(models=infos)


def _with_influence(state: AppState, info: ModelInfo) -> ModelInfo:
    found = state.influence.states.get(info.id) if state.influence is not None else None
    if found is not None:
        info.influence = found.public()
    return info


@router.get("/v1/models/{model_id}", response_model=ModelInfo, operation_id="getModel")
async def get_model(model_id: str, state: State, request: Request) -> ModelInfo:
    """One model: its state, inputs, output, layers and the methods it serves (an unloaded
    one too, with ``state`` "unloaded")."""
    spec = state.known(model_id)
    info = serving.model_info(
        spec, state.pool.model_info.get(spec.id), state.pool.states()[spec.id]
    )
    return _with_influence(state, info)


@router.get("/v1/methods", response_model=MethodList, operation_id="listMethods")
async def list_methods(state: State, request: Request) -> MethodList:
    """Every registered method with its parameters' JSON schema."""
    return method_list()
