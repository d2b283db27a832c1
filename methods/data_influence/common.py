"""Argument checks, checkpoints and per-example losses shared by the influence methods."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from methods.engine.layers import resolve
from methods.errors import (
    AttributionError,
    InvalidArgumentError,
    InvalidTypeError,
    UnsupportedModelError,
)

Tensors = tuple[Tensor, ...]
State = dict[str, Tensor]

METHODS = ("tracin_cp", "tracin_cp_fast", "tracin_cp_fast_rand_proj", "similarity")
FAST = ("tracin_cp_fast", "tracin_cp_fast_rand_proj")
SIMILARITIES = ("cosine", "euclidean")
DEFAULT_BATCH_SIZE = 64


@dataclass
class InfluenceResult:
    """``scores`` (n_test, n_train) when ``indices`` is None, else the top ``k`` per test
    example: ``indices`` (n_test, k) into the training set and their ``scores``."""

    scores: Tensor
    indices: Tensor | None = None


def _loss_shape(out: Tensor, y: Tensor, name: str) -> None:
    if out.shape != y.shape:
        raise InvalidArgumentError(
            f"loss {name!r} needs labels shaped like the model output {tuple(out.shape)}, "
            f"got {tuple(y.shape)}",
            argument="labels",
        )


def _cross_entropy(out: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(out, y, reduction="none")


def _nll(out: Tensor, y: Tensor) -> Tensor:
    return F.nll_loss(out, y, reduction="none")


def _mse(out: Tensor, y: Tensor) -> Tensor:
    _loss_shape(out, y, "mse")
    return F.mse_loss(out, y, reduction="none")


def _bce(out: Tensor, y: Tensor) -> Tensor:
    _loss_shape(out, y, "bce_with_logits")
    return F.binary_cross_entropy_with_logits(out, y, reduction="none")


#: element-wise losses (reduction "none"); an example's loss is the sum over its elements
LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "cross_entropy": _cross_entropy,
    "nll": _nll,
    "mse": _mse,
    "bce_with_logits": _bce,
}


def example_losses(loss: str, out: Tensor, y: Tensor) -> Tensor:
    """One loss per example (n,): the element-wise loss summed over all but dim 0."""
    if not isinstance(out, Tensor):
        raise InvalidTypeError(
            f"the model must return a Tensor, got {type(out).__name__}", argument="model"
        )
    if out.dim() == 0:
        raise InvalidArgumentError("the model output must have a batch dimension", argument="model")
    try:
        values = LOSSES[loss](out, y)
    except AttributionError:
        raise
    except Exception as exc:
        raise InvalidArgumentError(
            f"loss {loss!r} cannot take these labels: {type(exc).__name__}: {exc}",
            argument="labels",
        ) from exc
    return values.reshape(values.shape[0], -1).sum(dim=1) if values.dim() != 1 else values


def check_choice(value: object, choices: Sequence[str], argument: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(
            f"{argument} must be one of {', '.join(choices)}; got {value!r}", argument=argument
        )
    return value


def check_model(model: object) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"influence needs a torch.nn.Module, got {type(model).__name__}", argument="model"
        )
    return model


def format_inputs(value: object, argument: str) -> Tensors:
    """A tensor or a tuple of tensors sharing dim 0, as a non-empty tuple."""
    xs = (value,) if isinstance(value, Tensor) else value
    if not isinstance(xs, (tuple, list)) or not xs or not all(isinstance(x, Tensor) for x in xs):
        raise InvalidTypeError(
            f"{argument} must be a Tensor or a tuple of Tensors, got {type(value).__name__}",
            argument=argument,
        )
    if any(x.dim() == 0 for x in xs) or len({x.shape[0] for x in xs}) != 1:
        raise InvalidArgumentError(
            f"every tensor of {argument} needs the same number of examples in dim 0, got "
            f"shapes {[tuple(x.shape) for x in xs]}",
            argument=argument,
        )
    if xs[0].shape[0] == 0:
        raise InvalidArgumentError(f"{argument} holds no examples", argument=argument)
    return tuple(xs)


def format_labels(value: object, n: int, argument: str, inputs_argument: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise InvalidTypeError(
            f"{argument} must be a Tensor, got {type(value).__name__}", argument=argument
        )
    if value.dim() == 0 or value.shape[0] != n:
        raise InvalidArgumentError(
            f"{argument} must hold one label per example of {inputs_argument} ({n}), got "
            f"shape {tuple(value.shape)}",
            argument=argument,
        )
    return value


def check_int(value: object, argument: str, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgumentError(
            f"{argument} must be an integer >= {low}, got {value!r}", argument=argument
        )
    if high is not None and value > high:
        raise InvalidArgumentError(
            f"{argument} must be at most {high} (the number of training examples), got {value}",
            argument=argument,
        )
    return value


def check_batch_size(value: object) -> int:
    return DEFAULT_BATCH_SIZE if value is None else check_int(value, "batch_size", low=1)


def check_seed(value: object) -> int:
    """Captum's default seed is 0."""
    return 0 if value is None else check_int(value, "seed", low=0)


def layer_paths(layers: object) -> list[str] | None:
    if layers is None:
        return None
    paths = [layers] if isinstance(layers, str) else layers
    if (
        not isinstance(paths, (list, tuple))
        or not paths
        or not all(isinstance(p, str) and p for p in paths)
    ):
        raise InvalidArgumentError(
            f"layers must be a dotted module path or a non-empty list of them, got {layers!r}",
            argument="layers",
        )
    return list(paths)


def module_at(model: nn.Module, path: str) -> nn.Module:
    """``model.get_submodule(path)``, errors naming ``layers``."""
    try:
        return resolve(model, path)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(str(exc), argument="layers") from None


def one_layer(model: nn.Module, paths: list[str] | None, method: str) -> str:
    """The one layer a fast or similarity method works on (fast: the last nn.Linear by
    default)."""
    if paths is None:
        if method == "similarity":
            raise InvalidArgumentError(
                "similarity compares the activations of one layer: name it in layers",
                argument="layers",
            )
        linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
        if not linear:
            raise InvalidArgumentError(
                f"{method} needs an nn.Linear layer and the model has none", argument="layers"
            )
        return linear[-1]
    if len(paths) != 1:
        raise InvalidArgumentError(
            f"{method} works on exactly one layer, got {len(paths)}: {paths}", argument="layers"
        )
    module = module_at(model, paths[0])
    if method in FAST and not isinstance(module, nn.Linear):
        raise InvalidArgumentError(
            f"{method} needs an nn.Linear layer; {paths[0]!r} is a {type(module).__name__}",
            argument="layers",
        )
    return paths[0]


@dataclass
class Checkpoint:
    """One checkpoint: its weights (a state dict, or a path to a ``torch.save``'d one) and
    the learning rate its contribution is weighted by."""

    weights: Mapping[str, Any] | str | os.PathLike[str]
    lr: float

    def load(self, model: nn.Module) -> State:
        """The state as ``model.load_state_dict`` would take it: every key of the model's
        state dict (a ``module.`` prefix stripped), cast to its tensor's dtype and device;
        tied names kept once."""
        weights = self.weights
        if not isinstance(weights, Mapping):
            path = os.fspath(weights)
            try:
                weights = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise InvalidArgumentError(
                    f"cannot load checkpoint {path!r}: {type(exc).__name__}: {exc}",
                    argument="checkpoints",
                ) from exc
            if not isinstance(weights, Mapping):
                raise InvalidTypeError(
                    f"checkpoint file {path!r} holds a {type(weights).__name__}, not a state dict",
                    argument="checkpoints",
                )
        own = model.state_dict(keep_vars=True)
        if all(isinstance(k, str) and k.startswith("module.") for k in weights) and not all(
            k.startswith("module.") for k in own
        ):
            weights = {k[len("module.") :]: v for k, v in weights.items()}
        missing = [k for k in own if k not in weights]
        unexpected = [k for k in weights if k not in own]
        if missing or unexpected:
            raise InvalidArgumentError(
                "a checkpoint does not match the model's state dict: "
                f"missing {missing[:5]}, unexpected {unexpected[:5]}",
                argument="checkpoints",
            )
        buffers = {name for name, _ in model.named_buffers()}
        seen: set[int] = set()
        state: State = {}
        for name, ref in own.items():
            if id(ref) in seen:  # a tied alias: functional_call ties it to the first name
                continue
            seen.add(id(ref))
            value = weights[name]
            if not isinstance(value, Tensor) or value.shape != ref.shape:
                raise InvalidArgumentError(
                    f"checkpoint entry {name!r} must be a tensor of shape {tuple(ref.shape)}",
                    argument="checkpoints",
                )
            dtype = ref.dtype if value.is_floating_point() else value.dtype
            value = value.detach().to(device=ref.device, dtype=dtype)
            # a forward in training mode updates buffers in place: never the caller's tensors
            state[name] = value.clone() if name in buffers else value
        return state


def check_lr(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(
            f"a checkpoint's lr must be a number, got {type(value).__name__}",
            argument="checkpoints",
        )
    lr = float(value)
    if not math.isfinite(lr) or lr <= 0:
        raise InvalidArgumentError(
            f"a checkpoint's lr must be a finite number > 0, got {value!r}",
            argument="checkpoints",
        )
    return lr


def _is_entry(item: Mapping[Any, Any]) -> bool:
    return "weights" in item and set(item) <= {"weights", "lr"}


def format_checkpoints(checkpoints: object, method: str) -> list[Checkpoint]:
    """``[{"weights": state dict or path, "lr": float}, ...]``; a bare state dict or path
    in the list has lr 1 (Captum's default learning rate)."""
    if method == "similarity":
        if checkpoints is not None:
            raise InvalidArgumentError(
                "similarity compares the activations of the model as it is; it takes no "
                "checkpoints",
                argument="checkpoints",
            )
        return []
    if checkpoints is None or (isinstance(checkpoints, (list, tuple)) and not checkpoints):
        raise InvalidArgumentError(
            f"{method} needs checkpoints: a list of {{'weights': state dict or path, 'lr': float}}",
            argument="checkpoints",
        )
    if not isinstance(checkpoints, (list, tuple)):
        raise InvalidTypeError(
            f"checkpoints must be a list, got {type(checkpoints).__name__}",
            argument="checkpoints",
        )
    out = []
    for item in checkpoints:
        if isinstance(item, Mapping) and _is_entry(item):
            weights, lr = item["weights"], check_lr(item.get("lr", 1.0))
        else:
            weights, lr = item, 1.0
        if not isinstance(weights, (Mapping, str, os.PathLike)):
            raise InvalidTypeError(
                "a checkpoint's weights must be a state dict or a path, got "
                f"{type(weights).__name__}",
                argument="checkpoints",
            )
        out.append(Checkpoint(weights, lr))
    return out


def fingerprint(state: State) -> Tensor:
    """(sum, sum of squares) of a state's floating tensors, in float64: tells whether a query
    runs with the checkpoints an index was built with."""
    total = torch.zeros(2, dtype=torch.float64)
    for t in state.values():
        if t.is_floating_point():
            d = t.detach().to(torch.float64)
            total += torch.stack([d.sum(), (d * d).sum()]).cpu()
    return total


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def top_k(scores: Tensor, k: int, largest: bool) -> InfluenceResult:
    """The ``k`` highest (descending) or lowest (ascending) scores of each row."""
    values, indices = torch.topk(scores, k, dim=1, largest=largest)
    return InfluenceResult(values, indices)
