"""Worker-side helpers of the kinds that take tensors: a job's arrays (or texts, through the
tokenizer) as tensors on the model's device, the model's forward with its failure reported as
the engine reports one, and tensors back to arrays."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import torch
from torch import nn

from methods.errors import ModelError
from model_registry.spec import LoadedModel
from service.core.errors import WHERE, InvalidRequest, LimitExceeded
from service.core.work import Work
from service.kinds.runtime import disable_compiled, worth_eager_retry


def tensor(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a)).to(device)


def convert(value: Any, device: torch.device) -> Any:
    """Arrays (also inside tuples and lists) as tensors on ``device``; other values as they are."""
    if isinstance(value, np.ndarray):
        return tensor(value, device)
    if isinstance(value, tuple):
        return tuple(convert(v, device) for v in value)
    if isinstance(value, list):
        return [convert(v, device) for v in value]
    return value


def numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().to("cpu")
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def flat(value: Any) -> list[torch.Tensor]:
    """A tensor or a nested tuple of them, depth first (a layer's output such as an LSTM's)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in flat(v)]


def vocabulary(lm: LoadedModel) -> int | None:
    """Token models: how many ids the embedding layer holds (None: no ``nn.Embedding`` there)."""
    if "vocabulary" not in lm.extra:
        size = None
        name = lm.spec.embedding_layer
        if name is not None and isinstance(lm.model, nn.Module):
            with contextlib.suppress(AttributeError):
                layer = lm.model.get_submodule(name)
                if isinstance(layer, nn.Embedding):
                    size = int(layer.num_embeddings)
        lm.extra["vocabulary"] = size
    found: int | None = lm.extra["vocabulary"]
    return found


def check_ids(lm: LoadedModel, arrays: tuple[np.ndarray, ...]) -> None:
    """Token ids within the embedding's vocabulary (else the model's own IndexError)."""
    size = vocabulary(lm)
    if size is None:
        return
    floor = min(0, int(getattr(lm.tokenizer, "padded", 0)))  # a padding marker (-1) if any
    for a, spec in zip(arrays, lm.spec.inputs, strict=True):
        if a.dtype.kind not in "iu" or not a.size:
            continue
        low, high = int(a.min()), int(a.max())
        if low < floor or high >= size:
            bad = low if low < floor else high
            where: tuple[str | int, ...] = (
                ("body", "inputs") if len(arrays) == 1 else ("body", "inputs", spec.name)
            )
            raise InvalidRequest(
                f"{WHERE} holds token id {bad}; input {spec.name!r} of model {lm.spec.id!r} "
                f"takes ids 0..{size - 1} (its embedding's vocabulary)"
                + (f", and {floor} where a row is padded" if floor < 0 else ""),
                loc=where,
            )


def inputs(lm: LoadedModel, work: Work) -> tuple[tuple[torch.Tensor, ...], list[list[str]] | None]:
    """The job's inputs as tensors on the model's device (texts through the tokenizer), token
    ids checked against the vocabulary."""
    if not work.texts:  # to the declared dtypes (bfloat16 travels as float32)
        check_ids(lm, work.arrays)
        specs = lm.spec.inputs
        return tuple(
            tensor(a, lm.device).to(i.torch_dtype) for a, i in zip(work.arrays, specs, strict=True)
        ), None
    if lm.tokenizer is None:
        raise InvalidRequest(
            f"model {work.model_id!r} has no tokenizer; send token ids", loc=("body", "inputs")
        )
    if not getattr(lm.tokenizer, "pairs", False) and not all(
        isinstance(t, str) for t in work.texts
    ):
        raise InvalidRequest(
            f"model {work.model_id!r} takes single texts; its tokenizer encodes no text pairs",
            loc=("body", "inputs"),
        )
    try:
        ids, tokens = lm.tokenizer(list(work.texts))
    except ValueError as exc:  # a text the model cannot take (longer than its positions)
        raise InvalidRequest(str(exc), loc=("body", "inputs")) from None
    for i, toks in enumerate(tokens):
        if not toks:  # as an empty text is (service.wire.codec): an all-padding row gave [[0.0]]
            raise InvalidRequest(
                f"text {i} has no word to attribute to: the model's tokenizer finds no token "
                "in it (punctuation alone, say)",
                loc=("body", "inputs", i),
            )
    longest = max(len(t) for t in tokens) if tokens else 0
    if work.max_tokens is not None and longest > work.max_tokens:
        raise LimitExceeded(
            f"a text has {longest} tokens; this server takes at most {work.max_tokens}",
            loc=("body", "inputs"),
        )
    return (ids.to(lm.device),), tokens


def forward(lm: LoadedModel, xs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The model's output; its own failure reported as the engine reports one (a 422 that
    names the request id, the details in the log)."""
    compiled = lm.extra.get("compiled")
    try:
        with torch.no_grad():
            try:
                out = (lm.model if compiled is None else compiled)(*xs)
            except Exception as exc:
                if compiled is None or not worth_eager_retry(exc):
                    raise
                out = lm.model(*xs)  # the model's own failure, if it fails eagerly too
                disable_compiled(lm, exc, "on a request")
    except torch.OutOfMemoryError:
        raise
    except Exception as exc:
        raise ModelError(
            f"the model raised {type(exc).__name__}: {exc}", argument="inputs"
        ) from exc
    if not isinstance(out, torch.Tensor):
        raise InvalidRequest("the model did not return one tensor", loc=("body", "target"))
    return out
