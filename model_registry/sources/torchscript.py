"""``torchscript:PATH``: a TorchScript file (``torch.jit.save``), loaded onto the device.

TorchScript modules take no forward hooks, so they serve no layer or neuron methods, and
``torch.compile`` does not take them."""

from __future__ import annotations

import warnings
from types import MappingProxyType

import torch

from model_registry.checks import existing_file
from model_registry.errors import RegistryError
from model_registry.sources.base import FileSource, Source, register
from model_registry.spec import ModelSpec
from model_registry.table import Table
from model_registry.task_loaders import Built

_NO_HOOKS = (
    "TorchScript models cannot run layer or neuron methods (they need forward hooks, which "
    "TorchScript does not allow); leave it empty, or serve the eager model through a python: "
    "or export: source"
)


@register
class TorchScriptSource(FileSource):
    name = "torchscript"
    hookable = False  # a scripted module runs no Python forward hooks
    syntax = "torchscript:PATH"
    refused = MappingProxyType(
        {"weights": "torchscript: files carry their own weights; remove 'weights'"}
    )

    def spec(self, table: Table, source: Source) -> ModelSpec:
        spec = super().spec(table, source)
        if spec.layers or spec.embedding_layer:
            table.fail("layers" if spec.layers else "embedding_layer", _NO_HOOKS)
        if spec.compile:
            table.fail("compile", "torch.compile does not take TorchScript modules")
        return spec

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        path = existing_file(source.path(spec.base_dir), spec, "source")
        try:
            with warnings.catch_warnings():
                # torch >= 2.9 deprecates TorchScript for new code; serving a user's existing
                # file is what this source is for, so the notice would only be log noise.
                warnings.simplefilter("ignore", DeprecationWarning)
                model = torch.jit.load(str(path), map_location=device)
        except Exception as e:  # torch raises RuntimeError, ValueError, zipfile errors...
            raise RegistryError(
                f"{str(path)!r} is not a loadable TorchScript file: {e}",
                model=spec.id,
                field="source",
            ) from e
        return Built(model, scripted=True)
