"""Load-time checks every source shares: the device, files, declared layers, a forward probe.

Each raises RegistryError naming the model and the field at fault, so a wrong declaration stops
start-up with a message instead of failing at the first request.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import torch
from torch import nn

from model_registry.errors import RegistryError
from model_registry.spec import DEVICE, MODEL_DTYPES, LoadedModel, ModelSpec


def resolve_device(device: str, model_id: str | None = None) -> torch.device:
    """Resolve "auto" to cuda:0 when CUDA is available, else cpu; "cuda:N" must exist."""
    if not DEVICE.match(device):
        raise RegistryError(
            f"expected 'auto', 'cpu' or 'cuda:N', got {device!r}", model=model_id, field="device"
        )
    if device == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda"):
        index = int(device.partition(":")[2])
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if index >= count:
            have = f"{count} CUDA device(s)" if count else "no CUDA device"
            raise RegistryError(
                f"{device} requested but this machine has {have}; use 'auto' or 'cpu'",
                model=model_id,
                field="device",
            )
    return torch.device(device)


def check_dtype(spec: ModelSpec) -> torch.dtype:
    """The spec's working dtype, one a model's parameters may be cast to."""
    if spec.dtype not in MODEL_DTYPES:
        raise RegistryError(
            f"expected one of {list(MODEL_DTYPES)}, got {spec.dtype!r}",
            model=spec.id,
            field="dtype",
        )
    dtype: torch.dtype = getattr(torch, spec.dtype)
    return dtype


def existing_file(path: Path, spec: ModelSpec, field: str) -> Path:
    """``path``, which must be a file (else the error names ``field``)."""
    if not path.is_file():
        raise RegistryError(f"file {str(path)!r} not found", model=spec.id, field=field)
    return path


def check_layers(spec: ModelSpec, model: nn.Module, *, is_torchscript: bool = False) -> None:
    """Every declared layer and the embedding layer must be a submodule of ``model``."""
    declared = [("layers", name) for name in spec.layers]
    if spec.embedding_layer is not None:
        declared.append(("embedding_layer", spec.embedding_layer))
    if declared and is_torchscript:
        raise RegistryError(
            "TorchScript models cannot run layer or neuron methods (they need forward hooks, "
            "which TorchScript does not allow); leave 'layers' and 'embedding_layer' empty, or "
            "serve the eager model through a python: or export: source",
            model=spec.id,
            field=declared[0][0],
        )
    valid = [n for n, _ in model.named_modules() if n and not n.startswith("_")]
    for field, name in declared:
        try:
            model.get_submodule(name)
        except AttributeError:
            near = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
            hint = f"nearest: {near}" if near else f"valid names include {valid[:10]}"
            raise RegistryError(
                f"the model has no submodule {name!r}; {hint}", model=spec.id, field=field
            ) from None


def zeros(loaded: LoadedModel) -> list[torch.Tensor] | None:
    """Two examples of zeros shaped as the inputs are declared; None when an input has a free
    dim other than the batch (no size is then known to be valid)."""
    inputs = loaded.spec.inputs
    if any(d is None for i in inputs for d in i.shape[1:]):
        return None
    return [
        torch.zeros([2, *(int(d or 0) for d in i.shape[1:])], dtype=i.torch_dtype,
                    device=loaded.device)
        for i in inputs
    ]  # fmt: skip


def declared_shapes(spec: ModelSpec) -> str:
    """The probe's shapes as an error message shows them: ``x: float32[2, 8]``."""
    return ", ".join(f"{i.name}: {i.dtype}{[2, *i.shape[1:]]}" for i in spec.inputs)


def check_forward(loaded: LoadedModel, hint: str = "") -> None:
    """Run two examples of zeros through the model and compare the output with the spec.

    Catches a wrong input or output declaration (or an export without a dynamic batch dim)
    at start-up instead of at the first request. Skipped when an input has a free dim other
    than the batch, since then no size is known to be valid. ``hint`` follows the reason of a
    failed forward pass (what the source knows about its usual cause).
    """
    spec = loaded.spec
    xs = zeros(loaded)
    if xs is None:
        return
    try:
        with torch.no_grad():
            out = loaded.model(*xs)
    except Exception as e:
        raise RegistryError(
            f"a forward pass on zeros shaped as declared ({declared_shapes(spec)}) failed{hint}: "
            f"{type(e).__name__}: {e}",
            model=spec.id,
            field="inputs",
        ) from e
    want = (2, *spec.output.shape)
    got = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if (
        got is None
        or len(got) != len(want)
        or any(w is not None and w != g for w, g in zip(want, got, strict=True))
    ):
        shown = type(out).__name__ if got is None else f"shape {list(got)}"
        raise RegistryError(
            f"for a batch of 2 the model returned {shown}; declared output shape "
            f"{list(spec.output.shape)} per example means {list(want)}",
            model=spec.id,
            field="output_shape",
        )
