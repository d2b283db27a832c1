"""``export:PATH``: a ``torch.export`` program of the model (``torch.export.save``).

Its graph has its mode baked in (``eval()`` raises), and declared layers need the module tree
rebuilt (``torch.export.unflatten``) for forward hooks to fire."""

from __future__ import annotations

import warnings
from types import MappingProxyType

import torch

from model_registry.checks import existing_file
from model_registry.errors import RegistryError
from model_registry.sources.base import FileSource, Source, register
from model_registry.spec import ModelSpec
from model_registry.task_loaders import Built


@register
class ExportSource(FileSource):
    name = "export"
    syntax = "export:PATH"
    refused = MappingProxyType(
        {"weights": "export: files carry their own weights; remove 'weights'"}
    )

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        path = existing_file(source.path(spec.base_dir), spec, "source")
        try:
            program = torch.export.load(str(path))
        except Exception as e:
            raise RegistryError(
                f"{str(path)!r} is not a loadable torch.export file (saved with "
                f"torch.export.save): {e}",
                model=spec.id,
                field="source",
            ) from e
        hint = (
            " (an exported program must be exported with a dynamic batch dim, e.g. "
            "dynamic_shapes=({0: torch.export.Dim('batch')},))"
        )
        if not spec.layers and spec.embedding_layer is None:
            return Built(program.module(), has_modes=False, forward_hint=hint)
        # ``program.module()`` inlines every submodule into one flat graph, so forward hooks on
        # a "layer" would never fire; ``unflatten`` rebuilds the module tree with real calls.
        with warnings.catch_warnings():
            # torch's own unflatten trips its pytree deprecation warning (torch 2.13); not ours.
            warnings.simplefilter("ignore", FutureWarning)
            return Built(torch.export.unflatten(program), has_modes=False, forward_hint=hint)
