"""``hf:DIRECTORY``: a local Hugging Face model directory (config, safetensors weights,
tokenizer files), loaded with ``transformers`` (the ``attrserve[hf]`` extra), never from the
network.

A directory serves a causal language model (the kind's ``transformers`` Auto class loads it)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch

from model_registry.errors import RegistryError
from model_registry.model_kinds import MODEL_KINDS, Built
from model_registry.sources.base import ModelSource, Source, register
from model_registry.spec import ModelSpec
from model_registry.table import Table

#: the ``transformers`` Auto class that loads each kind
AUTO_CLASSES: Mapping[str, str] = MappingProxyType({"causal_lm": "AutoModelForCausalLM"})


@register
class HFSource(ModelSource):
    name = "hf"
    syntax = "hf:DIRECTORY"
    kinds = tuple(AUTO_CLASSES)
    refused = MappingProxyType(
        {"weights": "hf: directories carry their own weights; remove 'weights'"}
    )

    def validate(self, table: Table, source: Source) -> None:
        if not source.path(table.base_dir).is_dir():
            table.fail(
                "source",
                f"directory {source.target!r} not found{table.relative(source.target)}; hf: "
                "takes a local Hugging Face model directory (config, weights, tokenizer files)",
            )

    def kind(self, table: Table, source: Source) -> str:
        kind = table.choice("kind", tuple(MODEL_KINDS), "causal_lm")
        if kind not in self.kinds:
            table.fail("kind", 'hf: sources are causal language models: kind = "causal_lm"')
        return kind

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        path = source.path(spec.base_dir)
        try:
            import transformers  # the optional extra, and a heavy import: only when used
        except ImportError:
            raise RegistryError(
                "hf: sources need the transformers package: pip install 'attrserve[hf]'",
                model=spec.id,
                field="source",
            ) from None
        auto = getattr(transformers, AUTO_CLASSES[spec.kind])
        try:
            # local_files_only: a directory on disk, never the network
            model = auto.from_pretrained(
                str(path), local_files_only=True, dtype=getattr(torch, spec.dtype)
            )
            tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # OSError, ValueError, KeyError for unknown architectures ...
            flat = " ".join(str(e).split())
            raise RegistryError(
                f"{str(path)!r} is not a loadable Hugging Face {spec.kind} directory (config, "
                f"weights and tokenizer files): {flat}",
                model=spec.id,
                field="source",
            ) from e
        return Built(model, tokenizer)
