"""attrserve's model registry: model specs, models.toml parsing, loaders, built-in demo models.

    import model_registry
    specs = model_registry.load_specs(path)       # None: the built-in demo registry
    loaded = model_registry.load(specs[0])        # LoadedModel: model on its device, checked

Never imports the service; the service depends on this package, not the other way round.
"""

from __future__ import annotations

from pathlib import Path

from model_registry import builtin, models_toml
from model_registry.errors import RegistryError
from model_registry.loaders import load
from model_registry.spec import InputSpec, LoadedModel, ModelSpec, OutputSpec

__all__ = [
    "InputSpec",
    "LoadedModel",
    "ModelSpec",
    "OutputSpec",
    "RegistryError",
    "builtin_specs",
    "load",
    "load_specs",
]


def builtin_specs() -> list[ModelSpec]:
    """The built-in demo models (tabular-mlp, image-cnn, text-classifier, tiny-lm), unloaded."""
    return builtin.specs()


def load_specs(path: str | Path | None) -> list[ModelSpec]:
    """The specs of a models.toml at ``path``, or the built-in demo registry when None.

    Raises RegistryError naming the file, model and field of the first problem.
    """
    if path is None:
        return builtin_specs()
    return models_toml.load_file(path)
