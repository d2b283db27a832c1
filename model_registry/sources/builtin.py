"""``builtin:NAME``: a demo model of ``model_registry.builtin`` with its committed weights
(or the file models.toml's ``weights`` names); what models.toml does not give comes from the
built-in's own spec."""

from __future__ import annotations

import torch

from model_registry import builtin
from model_registry.checks import existing_file
from model_registry.errors import RegistryError
from model_registry.sources.base import ModelSource, Source, register
from model_registry.spec import ModelSpec, resolve_path
from model_registry.table import Table
from model_registry.task_loaders import Built
from model_registry.tasks import TASKS


@register
class BuiltinSource(ModelSource):
    name = "builtin"
    syntax = "builtin:NAME"
    tasks = tuple(dict.fromkeys(b.task for b in builtin.BUILTINS.values()))

    def check_target(self, target: str) -> None:
        if target not in builtin.BUILTINS:
            raise ValueError(
                f"no built-in model {target!r}; built-ins are "
                f"{[f'builtin:{n}' for n in builtin.BUILTINS]}"
            )

    def defaults(self, table: Table, source: Source, task: str) -> ModelSpec:
        return builtin.BUILTINS[source.target].spec()

    def task(self, table: Table, source: Source) -> str:
        """A built-in's own task; models.toml's ``kind`` may only repeat it."""
        own = builtin.BUILTINS[source.target].task
        if table.choice("kind", tuple(TASKS), own) != own:
            table.fail("kind", f"builtin:{source.target} is of kind {own!r}")
        return own

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        weights = None
        if spec.weights is not None:
            weights = existing_file(resolve_path(spec.weights, spec.base_dir), spec, "weights")
        try:
            model, tokenizer = builtin.build(source.target, weights)
        except RegistryError as e:
            raise RegistryError(e.detail, model=spec.id, field=e.field) from e
        return Built(model, tokenizer)
