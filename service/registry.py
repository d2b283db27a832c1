"""The model registry as the service uses it (one import point for specs and loading)."""

from __future__ import annotations

from typing import Any

import model_registry
from model_registry.spec import LoadedModel, ModelSpec


def load_specs(path: str | None) -> list[ModelSpec]:
    fn = getattr(model_registry, "load_specs", None)
    if fn is None:  # TEMPORARY until model_registry/__init__.py lands
        from model_registry import builtin

        return builtin.specs()
    specs: list[ModelSpec] = fn(path)
    return specs


def load(spec: ModelSpec) -> LoadedModel:
    fn: Any = getattr(model_registry, "load", None)
    if fn is None:
        from model_registry.loaders import load as fn
    loaded: LoadedModel = fn(spec)
    return loaded


def registry_error() -> type[Exception]:
    err: type[Exception] = (
        getattr(model_registry, "RegistryError", None)
        or __import__("model_registry.errors", fromlist=["RegistryError"]).RegistryError
    )
    return err
