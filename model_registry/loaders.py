"""Turn a ModelSpec into a LoadedModel: build or read the model, put it on its device, check it.

Nothing here reaches the network: built-in weights are committed files, other sources are local
paths (relative ones taken from the models.toml's directory), and python factories are imported
from the environment or from that directory.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model_registry import builtin
from model_registry.errors import RegistryError
from model_registry.sources import DEVICE, MODEL_DTYPES, Source, parse_source, resolve_path
from model_registry.spec import LoadedModel, ModelSpec


def load(spec: ModelSpec) -> LoadedModel:
    """Load ``spec``'s model on its device in its dtype, in eval mode, with its layers checked.

    Raises RegistryError naming the model and the field at fault.
    """
    try:
        source = parse_source(spec.source)
    except ValueError as e:
        raise RegistryError(str(e), model=spec.id, field="source") from None
    device = resolve_device(spec.device, spec.id)
    if spec.dtype not in MODEL_DTYPES:
        raise RegistryError(
            f"expected one of {list(MODEL_DTYPES)}, got {spec.dtype!r}",
            model=spec.id,
            field="dtype",
        )
    if spec.kind == "causal_lm":
        return _load_causal_lm(spec, source, device)
    if source.kind == "attribution-export":
        return _load_attribution_export(spec, source, device)
    tokenizer = None
    if source.kind == "builtin":
        model, tokenizer = _load_builtin(spec, source)
    elif source.kind == "torchscript":
        model = _load_torchscript(spec, source, device)
    elif source.kind == "export":
        model = _load_export(spec, source)
    else:
        model, tokenizer = _load_python(spec, source)

    model = model.to(device=device, dtype=getattr(torch, spec.dtype))
    if source.kind != "export":  # an exported graph has its mode baked in; eval() raises
        model.eval()
    # Serving never trains and the engine differentiates inputs and activations only: frozen
    # parameters save the weight gradients, and leave the engine's guard nothing to toggle
    # (so concurrent requests on one model do not race on requires_grad flags).
    for p in model.parameters():
        p.requires_grad_(False)
    check_layers(spec, model, is_torchscript=source.kind == "torchscript")
    loaded = LoadedModel(
        spec=spec,
        model=model,
        device=device,
        is_torchscript=source.kind == "torchscript",
        tokenizer=tokenizer,
        extra={"source_kind": source.kind},
    )
    check_forward(loaded)
    return loaded


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


def _existing(path: Path, spec: ModelSpec, field: str) -> Path:
    if not path.is_file():
        raise RegistryError(f"file {str(path)!r} not found", model=spec.id, field=field)
    return path


def _load_builtin(spec: ModelSpec, source: Source) -> tuple[nn.Module, Any]:
    if source.target not in builtin.BUILTINS:
        raise RegistryError(
            f"no built-in model {source.target!r}; built-ins are {list(builtin.BUILTINS)}",
            model=spec.id,
            field="source",
        )
    weights = None
    if spec.weights is not None:
        weights = _existing(resolve_path(spec.weights, spec.base_dir), spec, "weights")
    try:
        return builtin.build(source.target, weights)
    except RegistryError as e:
        raise RegistryError(e.detail, model=spec.id, field=e.field) from e


def _load_torchscript(spec: ModelSpec, source: Source, device: torch.device) -> nn.Module:
    path = _existing(source.path(spec.base_dir), spec, "source")
    try:
        with warnings.catch_warnings():
            # torch >= 2.9 deprecates TorchScript for new code; serving a user's existing file
            # is what this source is for, so the notice would only be noise in the server log.
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path), map_location=device)
    except Exception as e:  # torch raises RuntimeError, ValueError, zipfile errors...
        raise RegistryError(
            f"{str(path)!r} is not a loadable TorchScript file: {e}", model=spec.id, field="source"
        ) from e


def _load_export(spec: ModelSpec, source: Source) -> nn.Module:
    path = _existing(source.path(spec.base_dir), spec, "source")
    try:
        program = torch.export.load(str(path))
    except Exception as e:
        raise RegistryError(
            f"{str(path)!r} is not a loadable torch.export file (saved with torch.export.save): "
            f"{e}",
            model=spec.id,
            field="source",
        ) from e
    if not spec.layers and spec.embedding_layer is None:
        return program.module()
    # ``program.module()`` inlines every submodule into one flat graph, so forward hooks on a
    # "layer" would never fire; ``unflatten`` rebuilds the module tree with real call sites.
    with warnings.catch_warnings():
        # torch's own unflatten trips its pytree deprecation warning (torch 2.13); not ours.
        warnings.simplefilter("ignore", FutureWarning)
        return torch.export.unflatten(program)


def _load_attribution_export(spec: ModelSpec, source: Source, device: torch.device) -> LoadedModel:
    """A program saved by ``methods.export.save``: its forward returns the attributions."""
    from methods.export import load as load_program

    path = _existing(source.path(spec.base_dir), spec, "source")
    try:
        program, desc = load_program(str(path))
    except Exception as e:
        raise RegistryError(
            f"{str(path)!r} is not a loadable attribution program (saved with "
            f"methods.export.save or torch.export.save): {e}",
            model=spec.id,
            field="source",
        ) from e
    step = spec.exported
    if step is None or (desc is not None and desc.get("method") != step.method):
        raise RegistryError(
            f"the file computes {desc and desc.get('method')!r}, the model was configured "
            f"for {step and step.method!r} (was the file replaced?)",
            model=spec.id,
            field="source",
        )
    if device.type != "cpu":
        from torch.export.passes import move_to_device_pass

        program = move_to_device_pass(program, device)
    loaded = LoadedModel(
        spec=spec,
        model=program.module(),
        device=device,
        extra={"source_kind": source.kind, "exported": step},
    )
    _check_program(loaded)
    return loaded


def _zeros(loaded: LoadedModel) -> list[torch.Tensor] | None:
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


def _check_program(loaded: LoadedModel) -> None:
    """Run two examples of zeros through an attribution program (with class 0 each, when it
    takes the classes), so a wrong declaration fails at start-up."""
    spec, step = loaded.spec, loaded.spec.exported
    xs = _zeros(loaded)
    if step is None or xs is None:
        return
    if step.per_example_target:
        xs.append(torch.zeros(2, dtype=torch.int64, device=loaded.device))
    try:
        with torch.no_grad():
            loaded.model(*xs)
    except Exception as e:
        shapes = ", ".join(f"{i.name}: {i.dtype}{[2, *i.shape[1:]]}" for i in spec.inputs)
        raise RegistryError(
            f"the program fails on zeros shaped as declared ({shapes}): {type(e).__name__}: "
            + " ".join(str(e).split())[:500],
            model=spec.id,
            field="inputs",
        ) from e


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


def _load_python(spec: ModelSpec, source: Source) -> tuple[nn.Module, Any]:
    with _importable_from(spec.base_dir):
        try:
            obj: Any = importlib.import_module(source.module)
        except ImportError as e:
            where = f" (also looked in {spec.base_dir!r})" if spec.base_dir else ""
            raise RegistryError(
                f"cannot import module {source.module!r}{where}: {e}", model=spec.id, field="source"
            ) from e
    for part in source.attr.split("."):
        if not hasattr(obj, part):
            raise RegistryError(
                f"module {source.module!r} has no attribute {source.attr!r}",
                model=spec.id,
                field="source",
            )
        obj = getattr(obj, part)
    if not callable(obj):
        raise RegistryError(
            f"{source.target!r} is not callable; expected a factory returning an nn.Module",
            model=spec.id,
            field="source",
        )
    try:
        made = obj()
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
        path = _existing(resolve_path(spec.weights, spec.base_dir), spec, "weights")
        _load_weights(model, path, spec)
    return model, tokenizer


def _load_weights(model: nn.Module, path: Path, spec: ModelSpec) -> None:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

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


def check_forward(loaded: LoadedModel) -> None:
    """Run two examples of zeros through the model and compare the output with the spec.

    Catches a wrong input or output declaration (or an export without a dynamic batch dim)
    at start-up instead of at the first request. Skipped when an input has a free dim other
    than the batch, since then no size is known to be valid.
    """
    spec = loaded.spec
    xs = _zeros(loaded)
    if xs is None:
        return
    try:
        with torch.no_grad():
            out = loaded.model(*xs)
    except Exception as e:
        shapes = ", ".join(f"{i.name}: {i.dtype}{[2, *i.shape[1:]]}" for i in spec.inputs)
        hint = ""
        if loaded.extra.get("source_kind") == "export":
            hint = (
                " (an exported program must be exported with a dynamic batch dim, e.g. "
                "dynamic_shapes=({0: torch.export.Dim('batch')},))"
            )
        raise RegistryError(
            f"a forward pass on zeros shaped as declared ({shapes}) failed{hint}: "
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


def _load_causal_lm(spec: ModelSpec, source: Source, device: torch.device) -> LoadedModel:
    """A generative language model and its tokenizer (``LoadedModel.extra["lm_tokenizer"]``):
    built-in, a python: factory returning (model, tokenizer), or a local Hugging Face
    directory (``hf:``; transformers from the ``attrserve[hf]`` extra, local files only)."""
    if source.kind == "hf":
        model, tokenizer = _load_hf(spec, source)
    elif source.kind == "builtin":
        model, tokenizer = _load_builtin(spec, source)
    elif source.kind == "python":
        model, tokenizer = _load_python(spec, source)
    else:  # models_toml refuses these; a spec built by hand may still carry one
        raise RegistryError(
            f"a causal_lm model cannot come from a {source.kind}: source",
            model=spec.id,
            field="source",
        )
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise RegistryError(
            "a causal_lm model needs its tokenizer (an object with encode, decode, "
            "convert_ids_to_tokens and convert_tokens_to_ids, as Hugging Face's)",
            model=spec.id,
            field="source",
        )
    model = model.to(device=device, dtype=getattr(torch, spec.dtype))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    check_layers(spec, model)
    return LoadedModel(
        spec=spec,
        model=model,
        device=device,
        extra={"source_kind": source.kind, "lm_tokenizer": tokenizer},
    )


def _load_hf(spec: ModelSpec, source: Source) -> tuple[nn.Module, Any]:
    path = source.path(spec.base_dir)
    try:
        import transformers
    except ImportError:
        raise RegistryError(
            "hf: sources need the transformers package: pip install 'attrserve[hf]'",
            model=spec.id,
            field="source",
        ) from None
    try:
        # local_files_only: a directory on disk, never the network
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=getattr(torch, spec.dtype)
        )
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # OSError, ValueError, KeyError for unknown architectures ...
        flat = " ".join(str(e).split())
        raise RegistryError(
            f"{str(path)!r} is not a loadable Hugging Face causal LM directory (config, "
            f"weights and tokenizer files): {flat}",
            model=spec.id,
            field="source",
        ) from e
    return model, tokenizer
