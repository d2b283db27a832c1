"""Leave the caller's model exactly as it was found.

During an attribution the parameters stop requiring grad: we only ever differentiate with
respect to inputs or activations, and parameters that require grad make autograd save extra
activations (a Linear saves its input for the weight gradient), costing memory and time.
The flags are restored in ``finally``. No method changes training modes; hooks are owned and
removed by the methods that add them. On CUDA, recurrent modules in eval mode cannot run
cuDNN's backward, so cuDNN is switched off for the duration (the FAQ's workaround, done for
the user).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class _Anatomy:
    params: tuple[nn.Parameter, ...]
    has_rnn: bool


# Walking a model's modules costs more than a small model's forward pass, so what we need
# to know about a model is kept per model object (weakly: models are never kept alive).
_ANATOMY: weakref.WeakKeyDictionary[nn.Module, _Anatomy] = weakref.WeakKeyDictionary()


def _anatomy(model: nn.Module) -> _Anatomy:
    found = _ANATOMY.get(model)
    if found is None:
        found = _Anatomy(
            params=tuple(model.parameters()),
            has_rnn=any(isinstance(m, nn.RNNBase) for m in model.modules()),
        )
        _ANATOMY[model] = found
    return found


def is_torchscript(model: Any) -> bool:
    return isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction))


def needs_cudnn_off(model: nn.Module) -> bool:
    """True when cuDNN's RNN backward would refuse to run (RNN modules on a CUDA device)."""
    a = _anatomy(model)
    return a.has_rnn and any(p.is_cuda for p in a.params)


@contextlib.contextmanager
def model_guard(model: Any) -> Iterator[None]:
    if not isinstance(model, nn.Module):
        yield
        return
    params = [p for p in _anatomy(model).params if p.requires_grad]
    cudnn_off = needs_cudnn_off(model)
    try:
        for p in params:
            p.requires_grad_(False)
        if cudnn_off:
            with torch.backends.cudnn.flags(enabled=False):
                yield
        else:
            yield
    finally:
        for p in params:
            p.requires_grad_(True)
