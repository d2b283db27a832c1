"""What the tasks (``model_registry.tasks``) read and finish with: the spec a models.toml table
gives, and how a built model is finished (placed on its device, frozen, checked) at load.

Tensor models (``read_tensor``, ``finish_tensor``): tensors in and one output, with declared
inputs, labels or output shape. Language models (``read_causal_lm``, ``read_seq2seq_lm``,
``finish_language_model``): a generative language model with its tokenizer; its inputs are
prompts and its output the next token, so there is nothing of the sort to declare.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from methods.engine.precision import PRECISIONS
from methods.generation.features import encode
from model_registry.background import BackgroundError, check_rows, read_rows
from model_registry.checks import check_dtype, check_forward, check_layers
from model_registry.errors import RegistryError
from model_registry.spec import (
    COMPILE_MODES,
    MODEL_DTYPES,
    ExplainSpec,
    InputSpec,
    LoadedModel,
    ModelSpec,
    OutputSpec,
    resolve_path,
)
from model_registry.table import Table, describe_value


@dataclass(frozen=True)
class Built:
    """A model as its source built it, before its task finishes it."""

    model: nn.Module
    tokenizer: Any = None
    #: TorchScript: no forward hooks, so no layers (``LoadedModel.is_torchscript``)
    scripted: bool = False
    #: False where the module has no train mode to leave (an exported graph bakes its mode in)
    has_modes: bool = True
    #: what the source knows of the usual cause of a failed forward probe, for its message
    forward_hint: str = ""


# -- tensor ---------------------------------------------------------------------------------


def read_tensor(
    table: Table, base: ModelSpec | None, task: str | None = None, labels_dim: int | None = -1
) -> ModelSpec:
    """A tensor model's spec: ``task`` (default: the source's, else "tensor"); the labels
    name the entries of the output's dim ``labels_dim`` (the classes of a segmentation
    output are its first dim, ``[classes, H, W]``; None: of no dim, a detector's classes)."""
    dtype = table.choice("dtype", MODEL_DTYPES, base.dtype if base else "float32")
    if "inputs" in table or base is None:
        inputs = table.inputs()
    else:  # a built-in's own inputs, following a dtype override for its float inputs
        inputs = tuple(
            replace(i, dtype=dtype) if i.dtype in MODEL_DTYPES else i for i in base.inputs
        )
    labels = table.labels() if "labels" in table or base is None else base.output.labels
    if "output_shape" in table:
        shape = table.output_shape()
    elif base is not None and "labels" not in table:
        shape = base.output.shape  # a source's own (a token classifier's: [positions, labels])
    elif labels:
        shape = (len(labels),)
    else:
        table.fail(
            "output_shape",
            "required when there are no labels (per example, no batch "
            "dim; e.g. [] for one scalar per example)",
        )
    if labels and labels_dim == -1 and shape[-1:] != (len(labels),):  # the last dim's entries
        table.fail(
            "output_shape",
            f"with {len(labels)} labels the output must be [{len(labels)}] per example (or end "
            f"in {len(labels)}: a label per position), got {list(shape)}",
        )
    named = shape[labels_dim : labels_dim + 1] if labels_dim is not None else (len(labels),)
    if labels and labels_dim is not None and labels_dim >= 0 and named != (len(labels),):
        table.fail(
            "output_shape",
            f"with {len(labels)} labels the output's dim {labels_dim + 1} must hold "
            f"{len(labels)} classes, got {list(shape)}",
        )
    background, background_kmeans = _background(table, inputs)
    return ModelSpec(
        **table.common(description=base.description if base else ""),
        dtype=dtype,
        inputs=inputs,
        background=background,
        background_kmeans=background_kmeans,
        output=OutputSpec(shape=shape, labels=labels),
        layers=table.layers(base),
        embedding_layer=table.embedding_layer(base),
        weights=table.weights(),
        explain=explain(table),
        texts_batch=base.texts_batch if base is not None else False,
        images=base.images if base is not None else None,
        influence=base.influence if base is not None else None,
        # the source's task (a built-in's, a Hugging Face classifier's), else a plain tensor one
        task=task or (base.task if base is not None else "tensor"),
        **runtime(table),
    )


def read_regression(table: Table, base: ModelSpec | None) -> ModelSpec:
    """A regression model: one value per example, nothing to target."""
    if "labels" in table:
        table.fail("labels", "a regression model predicts one value: it has no labels")
    if "output_shape" not in table and base is None:  # (N, 1), as nn.Linear(..., 1) gives
        table = Table({**table.data, "output_shape": [1]}, table.file, table.index, table.base_dir)
    spec = read_tensor(table, base, "regression")
    if any(d != 1 for d in spec.output.shape):
        table.fail(
            "output_shape",
            f"a regression model gives one value per example ([] or [1]), got "
            f"{list(spec.output.shape)}",
        )
    return spec


def read_multi_label(table: Table, base: ModelSpec | None) -> ModelSpec:
    """A multi-label classifier: a logit per label, each its own sigmoid."""
    spec = read_tensor(table, base, "multi_label_classification")
    if len(spec.output.shape) != 1 or spec.output.shape[0] is None:
        table.fail(
            "output_shape",
            f"a multi-label classifier gives a logit per label ([labels]), got "
            f"{list(spec.output.shape)}",
        )
    return spec


def read_segmentation(table: Table, base: ModelSpec | None) -> ModelSpec:
    """A semantic segmentation model: ``[classes, H, W]`` logits per example (labels name the
    classes)."""
    spec = read_tensor(table, base, "semantic_segmentation", labels_dim=0)
    if len(spec.output.shape) < 3 or spec.output.shape[0] is None:
        table.fail(
            "output_shape",
            f"a segmentation model gives [classes, H, W] logits per example, got "
            f"{list(spec.output.shape)}",
        )
    return spec


def read_question_answering(table: Table, base: ModelSpec | None) -> ModelSpec:
    """An extractive question-answering model (``hf:`` directories): its spec is its
    directory's."""
    if base is None:
        table.fail(
            "kind",
            "question_answering models come from hf: directories (*ForQuestionAnswering)",
        )
    return read_tensor(table, base, "question_answering")


def read_image_text(table: Table, base: ModelSpec | None) -> ModelSpec:
    """Image–text pairs (``hf:`` ``CLIPModel`` directories): their spec is their directory's."""
    if base is None:
        table.fail("kind", "image_text_similarity models come from hf: directories (CLIPModel)")
    return read_tensor(table, base, "image_text_similarity", labels_dim=None)


def read_detection(table: Table, base: ModelSpec | None) -> ModelSpec:
    """An object detector: images in, detections out (``model_registry.detection``), served
    as one score per image: the detection matching a wanted box; ``labels`` name its classes
    by id."""
    why = {
        "output_shape": "a detector's output is its detections; remove output_shape",
        "layers": "a detector's layer methods are not served yet; remove layers",
    }
    table.refuse(why)
    labels = table.labels() if "labels" in table else (base.output.labels if base else ())
    given = {k: v for k, v in table.data.items() if k != "labels"}
    plain = Table({**given, "output_shape": []}, table.file, table.index, table.base_dir)
    spec = read_tensor(plain, base, "object_detection", labels_dim=None)
    return replace(spec, output=OutputSpec(shape=(), labels=labels), layers=())


def finish_detection(spec: ModelSpec, built: Built, device: torch.device) -> LoadedModel:
    """The detector wrapped as one score per image (``detection.BoxScore``, unless its
    source wrapped it), then finished as a tensor model."""
    from model_registry.detection import BoxScore

    if not isinstance(built.model, BoxScore):
        built = replace(built, model=BoxScore(built.model))
    return finish_tensor(spec, built, device)


def _background(table: Table, inputs: tuple[InputSpec, ...]) -> tuple[str | None, int | None]:
    """``background`` (a file of rows of the model's input, read and checked now) and
    ``background_kmeans`` (how many weighted rows summarise it)."""
    path = table.string("background")
    k = table.count("background_kmeans")
    if k is not None and path is None:
        table.fail("background_kmeans", "summarises the background file: add background")
    if path is not None:
        table.inside(path, "background")
        table.existing(path, "background")
        try:
            check_rows(read_rows(resolve_path(path, table.base_dir)), inputs)
        except BackgroundError as exc:
            table.fail("background", str(exc))
    return path, k


def explain(table: Table) -> ExplainSpec | None:
    """``explain = {method = "...", params = {...}}`` (the method is checked at start-up)."""
    if "explain" not in table:
        return None
    v = table.get("explain")
    if not isinstance(v, dict):
        table.fail(
            "explain",
            f"expected a table {{method = ..., params = {{...}}}}, got {describe_value(v)}",
        )
    unknown = sorted(set(v) - {"method", "params"})
    if unknown:
        table.fail(f"explain.{unknown[0]}", "unknown key; expected method and params")
    method, params = v.get("method"), v.get("params", {})
    if not isinstance(method, str) or not method:
        table.fail("explain.method", f"expected a method name, got {describe_value(method)}")
    if not isinstance(params, dict):
        table.fail(
            "explain.params",
            f"expected a table of the method's params, got {describe_value(params)}",
        )
    return ExplainSpec(method=method, params=params)


def _number(table: Table, key: str, default: Any, *, share: bool) -> Any:
    """A finite number: a share in [0, 1] (``share``), else positive; ``default`` if unset."""
    if key not in table:
        return default
    v = table.get(key)
    number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not number or not (0 <= v <= 1 if share else v > 0):
        want = "a number from 0 to 1" if share else "a positive number"
        table.fail(key, f"expected {want}, got {describe_value(v)}")
    return float(v)


def runtime(table: Table) -> dict[str, Any]:
    """``compile``, ``compile_mode``, ``verify_device``, ``precision``, ``fidelity_sample`` and
    ``fidelity_tolerance``."""
    compiled = table.flag("compile", False)
    if "compile_mode" in table and not compiled:
        table.fail("compile_mode", "takes effect with compile = true; add it, or remove this")
    verify = table.get("verify_device")
    if verify is not None and not isinstance(verify, bool):
        table.fail("verify_device", f"expected true or false, got {describe_value(verify)}")
    return {
        "compile": compiled,
        "compile_mode": table.choice("compile_mode", COMPILE_MODES, "default"),
        "verify_device": verify,
        "precision": table.choice("precision", PRECISIONS, "") if "precision" in table else None,
        "fidelity_sample": _number(table, "fidelity_sample", None, share=True),
        "fidelity_tolerance": _number(table, "fidelity_tolerance", 0.05, share=False),
    }


def _placed(spec: ModelSpec, built: Built, device: torch.device) -> nn.Module:
    model = built.model.to(device=device, dtype=check_dtype(spec))
    if built.has_modes:
        model.eval()
    # Serving never trains and the engine differentiates inputs and activations only: frozen
    # parameters save the weight gradients, and leave the engine's guard nothing to toggle
    # (so concurrent requests on one model do not race on requires_grad flags).
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def finish_tensor(spec: ModelSpec, built: Built, device: torch.device) -> LoadedModel:
    model = _placed(spec, built, device)
    check_layers(spec, model, is_torchscript=built.scripted)
    loaded = LoadedModel(
        spec=spec,
        model=model,
        device=device,
        is_torchscript=built.scripted,
        tokenizer=built.tokenizer,
    )
    check_forward(loaded, built.forward_hint)
    return loaded


# -- causal_lm ------------------------------------------------------------------------------

#: keys a causal_lm model does not take: its inputs are prompts, its output the next token
NOT_FOR_LM: Mapping[str, str] = MappingProxyType(
    {
        key: f"a causal_lm model takes prompts and attributes answers; it has no {key} to declare"
        for key in (
            "inputs",
            "labels",
            "output_shape",
            "explain",
            "compile",
            "compile_mode",
            "verify_device",
            "background",
            "background_kmeans",
        )
    }
)


#: the runtime keys a language model takes: its answers' precision and how it is checked
LM_RUNTIME = ("precision", "fidelity_sample", "fidelity_tolerance")


def read_causal_lm(table: Table, base: ModelSpec | None, task: str = "causal_lm") -> ModelSpec:
    table.refuse(NOT_FOR_LM)
    fidelity = {k: v for k, v in runtime(table).items() if k in LM_RUNTIME}
    return ModelSpec(
        **table.common(description=base.description if base else ""),
        **fidelity,
        dtype=table.choice("dtype", MODEL_DTYPES, base.dtype if base else "float32"),
        inputs=(InputSpec("ids", "int64", (None, None)),),
        output=base.output if base else OutputSpec(shape=(None, None)),
        layers=table.layers(base),
        embedding_layer=table.embedding_layer(base),
        weights=table.weights(),
        task=task,
    )


def read_seq2seq_lm(table: Table, base: ModelSpec | None) -> ModelSpec:
    """An encoder-decoder: as a causal_lm, its prompt the source (``hf:`` directories)."""
    return read_causal_lm(table, base, "seq2seq_lm")


def finish_language_model(spec: ModelSpec, built: Built, device: torch.device) -> LoadedModel:
    """The model with its tokenizer (``LoadedModel.text_tokenizer``, and as the callable every
    model that takes text has: ``LoadedModel.tokenizer``)."""
    tokenizer = built.tokenizer
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise RegistryError(
            "a causal_lm model needs its tokenizer (an object with encode, decode, "
            "convert_ids_to_tokens and convert_tokens_to_ids, as Hugging Face's)",
            model=spec.id,
            field="source",
        )
    model = _placed(spec, built, device)
    check_layers(spec, model)
    return LoadedModel(
        spec=spec,
        model=model,
        device=device,
        tokenizer=_texts(tokenizer),
        text_tokenizer=tokenizer,
    )


def _texts(tokenizer: Any) -> Callable[[Sequence[str]], tuple[torch.Tensor, list[list[str]]]]:
    """Texts as a batch of token ids (right-padded with the pad token, else 0) and tokens."""
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = 0 if pad is None else int(pad)

    def tokenize(texts: Sequence[str]) -> tuple[torch.Tensor, list[list[str]]]:
        ids = [encode(tokenizer, text) for text in texts]
        width = max((len(i) for i in ids), default=0)
        batch = torch.full((len(ids), width), pad, dtype=torch.int64)
        for row, i in enumerate(ids):
            batch[row, : len(i)] = torch.tensor(i, dtype=torch.int64)
        return batch, [list(tokenizer.convert_ids_to_tokens(i)) for i in ids]

    return tokenize
