"""A model source: what one ``source = "NAME:TARGET"`` prefix decides, and the table of them.

When models.toml is read, a source checks its target (its syntax, and that what it names is
there), refuses the keys that make no sense for it, says which task its model does and
builds the spec; at load, it builds the model, which the model's task then finishes. ``@register``
puts one instance of each in ``SOURCES``; the parser and the loader look a source up there
once, by the prefix, and never compare source names themselves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, TypeVar

import torch

from model_registry.errors import RegistryError
from model_registry.spec import LoadedModel, ModelSpec, resolve_path
from model_registry.table import Table
from model_registry.task_loaders import Built
from model_registry.tasks import DECLARED_TENSOR_TASKS, TASKS, task_of


@dataclass(frozen=True)
class Source:
    """A parsed ``source`` string."""

    name: str  # the source's name, a key of SOURCES: "builtin", "python", "hf", ...
    target: str  # builtin name, file path, directory or "package.module:factory"

    def path(self, base_dir: str | None) -> Path:
        """File sources: the file (hf: the directory), relative paths taken from ``base_dir``."""
        return resolve_path(self.target, base_dir)


class ModelSource:
    """What one source decides; subclasses set the class attributes and override the hooks
    that differ from the defaults here."""

    #: the prefix before the colon
    name: ClassVar[str]
    #: the whole form, as error messages list it ("torchscript:PATH")
    syntax: ClassVar[str]
    #: the model tasks it can serve (``TASKS`` keys); the first is the default
    tasks: ClassVar[tuple[str, ...]] = DECLARED_TENSOR_TASKS
    #: models.toml keys that only this source takes (beyond every model's keys)
    own_keys: ClassVar[tuple[str, ...]] = ()
    #: models.toml keys this source refuses, each with the message saying why
    refused: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: whether the target is a path (a file or directory) on this machine
    path_target: ClassVar[bool] = False
    #: what its models allow, declared here and read by the service (never inferred from the
    #: source's name): module hooks (layer, neuron and hook-based methods)
    hookable: ClassVar[bool] = True
    #: gradients of its output reach its inputs (False: forward-only methods alone)
    differentiable: ClassVar[bool] = True
    #: its forward runs in the worker (False: elsewhere, so nothing is warmed up or probed
    #: at load: a call there costs the predictor, and a predictor that is down must not
    #: stop the model loading)
    local: ClassVar[bool] = True

    # -- reading models.toml ---------------------------------------------------------------

    def check_target(self, target: str) -> None:
        """Raise ValueError, saying what was expected, when ``target`` is malformed."""

    def validate(self, table: Table, source: Source) -> None:
        """Check what the target names (a file or directory that must be there)."""

    def defaults(self, table: Table, source: Source, task: str) -> ModelSpec | None:
        """A spec filling in what models.toml does not give for a model of ``task``; None:
        nothing to fill in."""
        return None

    def task(self, table: Table, source: Source) -> str:
        """The model's task: models.toml's ``kind``, else the source's first."""
        task = table.choice("kind", tuple(TASKS), self.tasks[0])
        if task not in self.tasks:
            table.fail("source", self.not_serving(task))
        return task

    def spec(self, table: Table, source: Source) -> ModelSpec:
        """The spec of a models.toml table naming this source."""
        self.validate(table, source)
        table.refuse(self.refused)
        task = self.task(table, source)
        return TASKS[task].read(table, self.defaults(table, source, task))

    def not_serving(self, task: str) -> str:
        serving = [s.syntax for s in SOURCES.values() if task in s.tasks]
        where = one_of(serving) if serving else "no source"
        return f"a {task} model cannot come from a {self.name}: source; it comes from {where}"

    # -- loading ---------------------------------------------------------------------------

    def preload(self, spec: ModelSpec, source: Source) -> tuple[str, ...]:
        """Modules every load of ``spec`` imports, that the workers' forkserver may import
        once for all of them (``service.pool.processes``): plain imports only, nothing that
        starts threads or touches a device; a name that does not import is skipped there."""
        return ()

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        """The model (and its tokenizer), before its task places it on the device."""
        raise NotImplementedError(f"{self.name}: sources build no module; they override load")

    def load(self, spec: ModelSpec, source: Source, device: torch.device) -> LoadedModel:
        """``spec``'s model built, on its device and checked, as its task finishes it."""
        task = task_of(spec)
        if spec.task not in self.tasks:  # models_toml refuses these; a hand-built spec may not
            raise RegistryError(self.not_serving(spec.task), model=spec.id, field="source")
        loaded = task.finish(spec, self.build(spec, source, device), device)
        loaded.extra["source_kind"] = self.name
        return loaded


class FileSource(ModelSource):
    path_target = True
    """A source that is one file (checked to be there when models.toml is read)."""

    def validate(self, table: Table, source: Source) -> None:
        table.existing(source.target, "source")


_SOURCES: dict[str, ModelSource] = {}
#: every source, by the prefix of its ``source`` strings, in the order errors list them
SOURCES: Mapping[str, ModelSource] = MappingProxyType(_SOURCES)

S = TypeVar("S", bound=ModelSource)


def register(cls: type[S]) -> type[S]:
    """Class decorator: serve ``cls.name:TARGET`` sources with an instance of ``cls``."""
    if cls.name in _SOURCES:
        raise ValueError(f"source {cls.name!r} is registered twice")
    _SOURCES[cls.name] = cls()
    return cls


def one_of(items: list[str]) -> str:
    """``a, b or c``."""
    return " or ".join(filter(None, (", ".join(items[:-1]), items[-1])))


def source_of(spec: ModelSpec) -> ModelSource | None:
    """The source that serves ``spec`` (by its ``source`` string's prefix; None for a spec
    made in code with a source no one registered)."""
    return SOURCES.get(spec.source.partition(":")[0])


def preload(specs: Iterable[ModelSpec]) -> list[str]:
    """The modules the loads of ``specs`` import (``ModelSource.preload``), each once."""
    names: dict[str, None] = {}
    for spec in specs:
        found = source_of(spec)
        if found is not None:
            names.update(dict.fromkeys(found.preload(spec, parse_source(spec.source))))
    return list(names)


def parse_source(text: str) -> Source:
    """Split ``text`` into source and target; ValueError (saying what was expected) if
    malformed."""
    name, sep, target = text.partition(":")
    found = SOURCES.get(name) if sep else None
    if found is None:
        forms = one_of([repr(s.syntax) for s in SOURCES.values()])
        raise ValueError(f"expected {forms}, got {text!r}")
    if not target:
        raise ValueError(f"{name}: source needs a target after the colon, got {text!r}")
    found.check_target(target)
    return Source(name, target)
