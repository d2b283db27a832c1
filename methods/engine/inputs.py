"""Inputs, additional forward arguments and the model call, with Captum's semantics."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from methods.engine.batching import model_call, model_returned
from methods.engine.outputs import scaled
from methods.errors import AttributionError, InvalidArgumentError, InvalidTypeError, ModelError

Tensors = tuple[Tensor, ...]


#: the methods that take inputs whose dim 0 is not the batch's (``sparse`` below)
SPARSE_METHODS = "feature_ablation, shapley_value_sampling, shapley_values, feature_permutation"


def format_inputs(inputs: object, *, sparse: bool = False) -> tuple[Tensors, bool]:
    """Return ``inputs`` as a tuple of tensors and whether the caller passed a tuple.

    ``inputs[0]`` holds the examples along dim 0. With ``sparse`` the later inputs may have
    another dim 0 (Captum's sparse features: not per example, fed whole to every evaluation);
    otherwise every input must have the same number of examples.
    """
    if isinstance(inputs, Tensor):
        xs: Tensors = (inputs,)
        as_tuple = False
    elif isinstance(inputs, (tuple, list)) and inputs:
        for i, x in enumerate(inputs):
            if not isinstance(x, Tensor):
                raise InvalidTypeError(
                    f"inputs[{i}] must be a torch.Tensor, got {type(x).__name__}",
                    argument="inputs",
                )
        xs = tuple(inputs)
        as_tuple = True
    else:
        raise InvalidTypeError(
            f"inputs must be a Tensor or a non-empty tuple of Tensors, got {type(inputs).__name__}",
            argument="inputs",
        )
    n = None
    for i, x in enumerate(xs):
        if x.dim() == 0:
            raise InvalidArgumentError(
                f"inputs[{i}] is 0-dimensional; dim 0 must index the examples",
                argument="inputs",
            )
        if n is None:
            n = x.shape[0]
        elif x.shape[0] != n and not sparse:
            raise InvalidArgumentError(
                f"every input must have the same number of examples (dim 0): inputs[0] has {n}, "
                f"inputs[{i}] has {x.shape[0]}; an input that is not per example (Captum's "
                f"sparse features) is taken by {SPARSE_METHODS} only",
                argument="inputs",
            )
    if n == 0:
        raise InvalidArgumentError("inputs hold no examples (dim 0 is 0)", argument="inputs")
    return xs, as_tuple


def restore_form(xs: Tensors, as_tuple: bool) -> Tensor | Tensors:
    return xs if as_tuple else xs[0]


def format_args(args: object) -> tuple[Any, ...]:
    """Captum's rule: None -> (), a tuple as is, anything else a 1-tuple."""
    if args is None:
        return ()
    if isinstance(args, tuple):
        return args
    return (args,)


def expand_args(args: tuple[Any, ...], n: int, *, interleave: bool) -> tuple[Any, ...]:
    """Expand every tensor argument with dim >= 1 ``n`` times along dim 0.

    ``interleave`` keeps each example's copies together (x0, x0, x1, x1); otherwise the batch is
    tiled (x0, x1, x0, x1), which is what step-major schedules need.
    """
    if n == 1 or not args:
        return args
    out = []
    for a in args:
        if isinstance(a, Tensor) and a.dim() >= 1:
            a = (
                a.repeat_interleave(n, dim=0)
                if interleave
                else a.repeat((n,) + (1,) * (a.dim() - 1))
            )
        out.append(a)
    return tuple(out)


def tile(x: Tensor, n: int) -> Tensor:
    return x if n == 1 else x.repeat((n,) + (1,) * (x.dim() - 1))


@dataclass(frozen=True, slots=True)
class Forward:
    """The model bound to its additional forward arguments: ``forward(inputs) -> output``;
    with ``channels_last``, image batches reach it channels-last (``methods.engine.layout``)."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    channels_last: bool = False
    #: the scale attributed: the raw output or its probabilities, log-probabilities or
    #: log-odds (``methods.engine.outputs``); ``independent``: per-label sigmoids
    output: str = "raw"
    independent: bool = False

    def laid_out(self, inputs: Tensors) -> Tensors:
        """``inputs`` as the model gets them: image batches channels-last where set."""
        return images_channels_last(inputs) if self.channels_last else inputs

    def __call__(self, inputs: Tensors) -> Tensor:
        inputs = self.laid_out(inputs)
        token = model_call()
        probed = _probing.get() if self.channels_last else None
        try:
            with _ArgmaxProbe(probed) if probed is not None else contextlib.nullcontext():
                out = self.fn(*inputs, *self.args)
        except (AttributionError, torch.OutOfMemoryError, ArgmaxRouting):
            raise
        except Exception as exc:  # the model's own failure, reported as such
            raise ModelError(
                f"the model raised {type(exc).__name__}: {exc}", argument="inputs"
            ) from exc
        finally:
            model_returned(token)
        tensor = as_output_tensor(out, like=inputs[0])
        if self.output == "raw":
            return tensor
        return scaled(tensor, self.output, self.independent)  # type: ignore[arg-type]

    def expanded(self, n: int, *, interleave: bool = False) -> Forward:
        if n == 1 or not self.args:
            return self
        return dataclasses.replace(self, args=expand_args(self.args, n, interleave=interleave))


#: operations whose gradient goes to the arg-max of a window or a dimension, or follows a
#: sorted order: where inputs tie exactly, which one gets it is decided by rounding, and a
#: channels-last convolution rounds otherwise than the model as given (``methods.engine.layout``)
ARGMAX_ROUTING = frozenset(
    f"{name}{suffix}"
    for name in (
        "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
        "adaptive_max_pool3d", "fractional_max_pool2d", "fractional_max_pool3d",
    )
    for suffix in ("", "_with_indices")
) | {
    "max", "min", "amax", "amin", "argmax", "argmin", "topk", "sort", "argsort", "msort",
    "kthvalue", "median", "nanmedian", "mode", "cummax", "cummin",
}  # fmt: skip


class ArgmaxRouting(Exception):
    """Raised from a model call under ``argmax_probe`` where the model calls an operation of
    ``ARGMAX_ROUTING``."""


@dataclass
class Probed:
    """What ``argmax_probe`` saw: the first operation of ``ARGMAX_ROUTING``, or None."""

    seen: str | None = None


_probing: ContextVar[Probed | None] = ContextVar("argmax_probe", default=None)


@contextlib.contextmanager
def argmax_probe() -> Iterator[Probed]:
    """While entered, a channels-last model call (``Forward``) raises ``ArgmaxRouting`` at
    its first operation of ``ARGMAX_ROUTING`` (modules and functional calls alike), and the
    ``Probed`` yielded says so even where the model catches the exception itself."""
    probed = Probed()
    token = _probing.set(probed)
    try:
        yield probed
    finally:
        _probing.reset(token)


class _ArgmaxProbe(TorchFunctionMode):
    def __init__(self, probed: Probed) -> None:
        super().__init__()
        self.probed = probed

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = getattr(func, "__name__", None)
        if name in ARGMAX_ROUTING:
            self.probed.seen = self.probed.seen or name
            raise ArgmaxRouting(name)
        return func(*args, **(kwargs or {}))


class _ToChannelsLast(torch.autograd.Function):
    """A channels-last copy whose gradient comes back laid out as its input (NCHW), so that
    every attribution made from it is laid out as the caller's inputs are."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.contiguous(memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        return grad.contiguous()


def images_channels_last(inputs: Tensors) -> Tensors:
    """``inputs`` with their image batches (4-D, floating point) channels-last (what
    ``Forward`` feeds them; the tests stand a CPU that rounds otherwise in for it)."""
    return tuple(_channels_last(x) for x in inputs)


def _channels_last(x: Tensor) -> Tensor:
    """An image batch (4-D, floating point) channels-last; anything else as it is."""
    if not isinstance(x, Tensor) or x.dim() != 4 or not x.is_floating_point():
        return x
    if x.requires_grad and torch.is_grad_enabled():
        return cast(Tensor, _ToChannelsLast.apply(x))
    return x.contiguous(memory_format=torch.channels_last)


def as_output_tensor(out: object, like: Tensor) -> Tensor:
    if isinstance(out, Tensor):
        return out
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        # Captum allows a Python number as a scalar-per-batch output.
        dtype = torch.float64 if isinstance(out, float) else torch.int64
        return torch.tensor([out], dtype=dtype, device=like.device)
    raise InvalidTypeError(
        f"the model must return a Tensor, got {type(out).__name__}; wrap it in a function "
        "returning the logits tensor",
        argument="model",
    )


def check_floating(xs: Tensors, method: str) -> None:
    for i, x in enumerate(xs):
        if not (x.is_floating_point() or x.is_complex()):
            raise InvalidTypeError(
                f"{method} differentiates the model with respect to its inputs, but inputs[{i}] "
                f"has dtype {x.dtype}; pass floating-point inputs, or for token ids use "
                "layer_integrated_gradients on the embedding layer",
                argument="inputs",
            )
