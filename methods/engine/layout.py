"""Channels-last inputs for conv nets on a CPU.

oneDNN runs a 2-D convolution natively in the channels-last (NHWC) layout; fed the usual NCHW
it reorders every convolution's input and output. Fed channels-last, the layout carries from
one convolution to the next and the model is unchanged (its weights keep their layout). On a
2-core AVX-512 Xeon, float32, the same rows (2026-11-28): the benchmarks' 3x64x64 CNN forward
and backward 0.57-0.64x NCHW's time (a no-grad forward 0.28x), ResNet-50 0.87-0.90x (forward
0.88x), ViT-B/16, whose one convolution is its patch embedding, 0.99x. The answer is the same
function of the inputs: convolutions sum in another order, a difference at float32's rounding
(0 on the CNN's forward, checked against Captum by the parity tests).

A model that cannot take such inputs (``x.view(n, -1)`` after a convolution: a
channels-last tensor has no such view; a gradient hook viewing its gradient) raises; the
attribution is then run again as given, from the same random state, and that method is not
run channels-last on that model again. Only where it pays and is measured: CUDA is not
on the list until a GPU benchmark says so.

Ties are the exception (CONTRACT 9.1: the answer is the plain NCHW model's, on every CPU). A
convolution over a constant region (a constant baseline, a flat background, padding) gives
exactly equal values as given, and values a rounding apart channels-last, in an order that
depends on the CPU's kernels (AVX2 and AVX-512 differ). A forward's value does not care, but a
gradient through a max pooling (or a max, top-k, sort) goes to the one input that wins, so the
tie decides the answer: DeepLift with ``baselines=0.1`` on Conv-ReLU-MaxPool moved by 10% on an
AVX2 EPYC. So work that differentiates the model (``gradients``) is not fed channels-last
where the model routes gradients by an arg-max: a max-pooling module, or, seen by a probe
around the first channels-last run (``inputs.argmax_probe``), any such call in its forward; the
run is then made as given. Forward-only work (perturbation methods, the metrics' forwards)
keeps the layout on every model.

Attribution methods get it through ``tried`` (``methods.api``); work that runs the model in
forwards of its own (``evaluate``'s metrics, the attacks, ``min_perturbation``) through
``either``, each under its own key, so that a refusal is remembered per use.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from methods import progress
from methods.engine.batching import caused_by
from methods.engine.call import Call
from methods.engine.inputs import ArgmaxRouting, argmax_probe
from methods.errors import AttributionError, ModelError

R = TypeVar("R")

#: device types whose conv nets get channels-last inputs
DEVICES = ("cpu",)

#: per model: whether it has a 2-D convolution (walking a model costs more than a small
#: model's forward; kept weakly)
_HAS_CONV: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()
#: per model: the methods whose run failed on channels-last inputs and ran as given (a
#: method's own hooks may need the layout too: a DeepLift rule viewing a pooled activation)
_REFUSED: weakref.WeakKeyDictionary[nn.Module, set[str]] = weakref.WeakKeyDictionary()
#: per model: whether its gradients go through an arg-max (True: a module of ``_ARGMAX`` or a
#: call the probe saw; False: a probed run saw none; absent: not known yet)
_ROUTES: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()

#: modules whose gradient goes to the arg-max of a window
_ARGMAX = (
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d, nn.FractionalMaxPool2d, nn.FractionalMaxPool3d,
)  # fmt: skip


def suits(model: object, inputs: tuple[object, ...], key: str, gradients: bool = True) -> bool:
    """Whether ``model`` should get ``inputs``' image batches channels-last for ``key`` (a
    method, or another use with a forward of its own): a module with a 2-D convolution, no
    module in training mode with random draws or state of its own (``_trains``), a 4-D
    floating input on a listed device, ``key`` not refused by the model before, and, for
    work that differentiates the model (``gradients``), a model not known to route
    gradients by an arg-max (``routes_by_argmax``)."""
    if not isinstance(model, nn.Module) or key in _REFUSED.get(model, ()):
        return False
    if not any(_image(x) for x in inputs):
        return False
    has = _HAS_CONV.get(model)
    if has is None:
        has = any(isinstance(m, nn.Conv2d) for m in model.modules())
        _HAS_CONV[model] = has
    if not has or (gradients and routes_by_argmax(model)):
        return False
    return not any(_trains(m) for m in model.modules())


def routes_by_argmax(model: nn.Module) -> bool:
    """Whether ``model`` is known to send gradients to an arg-max (a max-pooling module, or
    a call the probe saw): a tie that rounding breaks otherwise channels-last would change
    a gradient's answer, not only its rounding."""
    known = _ROUTES.get(model)
    if known is None and any(isinstance(m, _ARGMAX) for m in model.modules()):
        known = _ROUTES[model] = True
    return bool(known)


#: modules that draw random numbers in training mode, element by element in memory order
#: (a channels-last batch gets other draws for the same seed)
_RANDOM = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
    nn.FeatureAlphaDropout, nn.RReLU,
)  # fmt: skip


def _trains(m: nn.Module) -> bool:
    """Whether ``m``, in training mode, draws random numbers (dropout: its answer would
    differ from the one as given for the same seed) or holds state of its own that a
    failed try must not move (a norm layer's running statistics, spectral norm's
    power-iteration vector)."""
    return m.training and (isinstance(m, _RANDOM) or any(True for _ in m.buffers(False)))


def tried(
    call: Call,
    method: str,
    run: Callable[[Call], R],
    again: Callable[[], Call],
    gradients: bool = True,
) -> R:
    """``run(call)`` with ``call``'s image batches fed channels-last; where the model
    fails on them, ``run`` on ``again()`` (``call`` with a fresh generator) as given
    (``attempt``)."""
    fed = call.replace(forward=dataclasses.replace(call.forward, channels_last=True))
    return attempt(call.model, method, lambda: run(fed), lambda: run(again()), gradients)


def attempt(
    model: object, key: str, fed: Callable[[], R], given: Callable[[], R], gradients: bool = True
) -> R:
    """``fed()`` (the work with image batches channels-last); where the model fails on
    them (its forward, or its backward: a gradient hook's view), ``given()`` as given, and
    ``key`` as given on that model from then on. Work that differentiates the model
    (``gradients``) on a model not yet probed runs under ``argmax_probe``: at a call that
    routes gradients by an arg-max, it stops and is run as given, and so is all such work
    on that model from then on. The run as given finds the global random stream (unseeded
    sampling; ``DEVICES`` are CPUs) and the progress bar where the try found them, and runs
    outside the failed try's handler, so that the model's own error, if it fails again, is
    reported alone."""
    rng, mark = torch.get_rng_state(), progress.mark()
    probing = gradients and isinstance(model, nn.Module) and model not in _ROUTES
    routes = False
    try:
        if not probing:
            return fed()
        with argmax_probe() as probed:
            result = fed()
        routes = probed.seen is not None  # the model caught the probe's exception itself
        if not routes:
            _ROUTES[model] = False  # type: ignore[index]
            return result
    except Exception as exc:  # the model's forward or backward failed on them, or not
        routes = caused_by(exc, lambda e: isinstance(e, ArgmaxRouting))
        if not routes and not_the_layout(exc):
            raise
    torch.set_rng_state(rng)
    progress.rewind(mark)
    result = given()
    if isinstance(model, nn.Module):
        if routes:
            _ROUTES[model] = True
        else:
            _REFUSED.setdefault(model, set()).add(key)
    return result


def not_the_layout(exc: BaseException) -> bool:
    """Whether ``exc`` is one no layout causes: the request's own (a bad target, a cancel:
    an ``AttributionError`` other than the model's failure) or memory, anywhere in the
    model's error's causes (CUDA's ``OutOfMemoryError``; a CPU allocation failure is a
    plain ``RuntimeError``)."""
    if isinstance(exc, AttributionError) and not isinstance(exc, ModelError):
        return True
    return caused_by(exc, _out_of_memory)


def _out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)
    )


def either(
    model: object,
    inputs: tuple[object, ...],
    key: str,
    work: Callable[[bool], R],
    gradients: bool = True,
) -> R:
    """``work(True)`` (image batches channels-last) where ``model`` suits them for ``key``,
    ``work(False)`` as given where it does not or fails on them (``attempt``);
    ``gradients``: the work differentiates the model."""
    if not suits(model, inputs, key, gradients):
        return work(False)
    return attempt(
        model, key, functools.partial(work, True), functools.partial(work, False), gradients
    )


def _image(x: object) -> bool:
    return (
        isinstance(x, Tensor)
        and x.dim() == 4
        and x.is_floating_point()
        and x.device.type in DEVICES
    )
