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
from methods.engine.call import Call
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


def eligible(call: Call, method: str) -> bool:
    """Whether ``call``'s forward should get its image inputs channels-last for ``method``
    (``suits``)."""
    return suits(call.model, call.inputs, method)


def suits(model: object, inputs: tuple[object, ...], key: str) -> bool:
    """Whether ``model`` should get ``inputs``' image batches channels-last for ``key`` (a
    method, or another use with a forward of its own): a module with a 2-D convolution, no
    module with state of its own in training mode (a failed first try must not have moved
    it: a norm layer's running statistics), a 4-D floating input on a listed device, and
    ``key`` not refused by the model before."""
    if not isinstance(model, nn.Module) or key in _REFUSED.get(model, ()):
        return False
    if not any(_image(x) for x in inputs):
        return False
    has = _HAS_CONV.get(model)
    if has is None:
        has = any(isinstance(m, nn.Conv2d) for m in model.modules())
        _HAS_CONV[model] = has
    return has and not any(m.training and _has_buffers(m) for m in model.modules())


def _has_buffers(m: nn.Module) -> bool:
    """Whether ``m`` holds state of its own that a training-mode forward may move (a norm
    layer's running statistics, spectral norm's power-iteration vector)."""
    return any(True for _ in m.buffers(recurse=False))


def tried(call: Call, method: str, run: Callable[[Call], R], again: Callable[[], Call]) -> R:
    """``run(call)`` with ``call``'s image batches fed channels-last; where the model
    fails on them, ``run`` on ``again()`` (``call`` with a fresh generator) as given
    (``attempt``)."""
    fed = call.replace(forward=dataclasses.replace(call.forward, channels_last=True))
    return attempt(call.model, method, lambda: run(fed), lambda: run(again()))


def attempt(model: object, key: str, fed: Callable[[], R], given: Callable[[], R]) -> R:
    """``fed()`` (the work with image batches channels-last); where the model fails on
    them (its forward, or its backward: a gradient hook's view), ``given()`` as given, and
    ``key`` as given on that model from then on. The run as given finds the global random
    stream (unseeded sampling; ``DEVICES`` are CPUs) and the progress bar where the try
    found them, and runs outside the failed try's handler, so that the model's own error,
    if it fails again, is reported alone."""
    rng, mark = torch.get_rng_state(), progress.mark()
    try:
        return fed()
    except ModelError:
        pass  # the model's forward failed on them
    except (AttributionError, torch.OutOfMemoryError):
        raise  # the request's own error, a cancel, memory: the layout is not the cause
    except Exception:
        pass  # the model's backward failed on them
    torch.set_rng_state(rng)
    progress.rewind(mark)
    result = given()
    if isinstance(model, nn.Module):
        _REFUSED.setdefault(model, set()).add(key)
    return result


def either(model: object, inputs: tuple[object, ...], key: str, work: Callable[[bool], R]) -> R:
    """``work(True)`` (image batches channels-last) where ``model`` suits them for ``key``,
    ``work(False)`` as given where it does not or fails on them (``attempt``)."""
    if not suits(model, inputs, key):
        return work(False)
    return attempt(model, key, functools.partial(work, True), functools.partial(work, False))


def _image(x: object) -> bool:
    return (
        isinstance(x, Tensor)
        and x.dim() == 4
        and x.is_floating_point()
        and x.device.type in DEVICES
    )
