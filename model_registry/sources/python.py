"""``python:package.module:factory``: a factory returning an ``nn.Module`` (or a
``(module, tokenizer)`` pair), imported from the environment or from the models.toml's
directory, with optional ``weights``: a safetensors file or a state_dict saved with
``torch.save`` (read with ``weights_only=True``: a weights file never runs code)."""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from model_registry.checks import existing_file
from model_registry.errors import RegistryError
from model_registry.sources.base import ModelSource, Source, register
from model_registry.spec import ModelSpec, resolve_path
from model_registry.task_loaders import Built
from model_registry.tasks import TASKS

_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_TARGET = re.compile(rf"^(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})$")


@register
class PythonSource(ModelSource):
    name = "python"
    syntax = "python:package.module:factory"
    tasks = tuple(t.name for t in TASKS.values() if t.from_code)

    def check_target(self, target: str) -> None:
        if not _TARGET.match(target):
            raise ValueError(
                "expected 'python:package.module:factory' (dotted module, colon, factory "
                f"name), got {f'python:{target}'!r}"
            )

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        factory = _factory(spec, source)
        try:
            made = factory()
        except Exception as e:
            raise RegistryError(
                f"factory {source.target!r} raised {type(e).__name__}: {e}",
                model=spec.id,
                field="source",
            ) from e
        # A factory may also hand back a tokenizer: (module, tokenizer).
        model, tokenizer = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
        if not isinstance(model, nn.Module):
            raise RegistryError(
                f"factory {source.target!r} returned {type(model).__name__}; expected an "
                "nn.Module (or a (module, tokenizer) pair)",
                model=spec.id,
                field="source",
            )
        if spec.weights is not None:
            path = existing_file(resolve_path(spec.weights, spec.base_dir), spec, "weights")
            _load_weights(model, path, spec)
        return Built(model, tokenizer)


@contextlib.contextmanager
def _importable_from(base_dir: str | None) -> Iterator[None]:
    # A factory module may sit next to models.toml; look there first, only while importing.
    if base_dir is None:
        yield
        return
    sys.path.insert(0, base_dir)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(base_dir)


def _factory(spec: ModelSpec, source: Source) -> Any:
    module, _, attr = source.target.partition(":")
    with _importable_from(spec.base_dir):
        try:
            obj: Any = importlib.import_module(module)
        except ImportError as e:
            where = f" (also looked in {spec.base_dir!r})" if spec.base_dir else ""
            raise RegistryError(
                f"cannot import module {module!r}{where}: {e}", model=spec.id, field="source"
            ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(
                f"module {module!r} has no attribute {attr!r}", model=spec.id, field="source"
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise RegistryError(
            f"{source.target!r} is not callable; expected a factory returning an nn.Module",
            model=spec.id,
            field="source",
        )
    return obj


def _load_weights(model: nn.Module, path: Path, spec: ModelSpec) -> None:
    try:
        if path.suffix == ".safetensors":
            state: Any = load_file(str(path), device="cpu")
        else:
            # weights_only: a state_dict is data; never run pickled code from a weights file
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:
        raise RegistryError(
            f"cannot read weights {str(path)!r} (expected a .safetensors file or a state_dict "
            f"saved with torch.save): {e}",
            model=spec.id,
            field="weights",
        ) from e
    if not isinstance(state, Mapping):
        raise RegistryError(
            f"{str(path)!r} holds a {type(state).__name__}, expected a state_dict (a mapping of "
            "parameter names to tensors)",
            model=spec.id,
            field="weights",
        )
    try:
        model.load_state_dict(state)
    except RuntimeError as e:  # names the missing/unexpected keys and shape mismatches
        flat = " ".join(str(e).split())  # torch's message spans lines; keep log entries whole
        raise RegistryError(
            f"weights {str(path)!r} do not fit the model: {flat}", model=spec.id, field="weights"
        ) from e
