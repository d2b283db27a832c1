"""What a Hugging Face classifier directory says of itself, read without its weights: the
config (plain JSON), the class names, and the paths of the layers served for layer methods (on
a copy of the model built on the meta device from the config alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn


def config(directory: Path) -> dict[str, Any]:
    doc = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return doc if isinstance(doc, dict) else {}


def labels(doc: dict[str, Any]) -> tuple[str, ...]:
    """The class names in id order (``id2label``; ``LABEL_i`` where a config has none)."""
    raw = doc.get("id2label") or {}
    n = int(doc.get("num_labels") or len(raw) or 2)
    names = {int(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
    return tuple(names.get(i, f"LABEL_{i}") for i in range(n))


def layer_paths(directory: Path, auto: str, prefix: str = "model") -> tuple[str | None, list[str]]:
    """The dotted paths (under ``prefix``, the wrapper's attribute holding the model) of the
    input embedding (None where the model names none: SegFormer's patch embeddings are per
    stage) and of the blocks of its first ``nn.ModuleList`` (a transformer's layers, a
    convnet's stages), in order."""
    import transformers

    cfg = transformers.AutoConfig.from_pretrained(str(directory), local_files_only=True)
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(cfg)
    try:
        emb = model.get_input_embeddings()
    except (NotImplementedError, AttributeError):
        emb = None
    embedding = next((n for n, m in model.named_modules() if m is emb), None)
    blocks: list[str] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module):
            blocks = [f"{prefix}.{name}.{i}" for i in range(len(module))]
            break
    return (None if embedding is None else f"{prefix}.{embedding}"), blocks
