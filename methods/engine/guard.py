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

import weakref
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


class model_guard:
    """Parameters stop requiring grad (and cuDNN's RNN backward is off) inside; the flags are
    restored on exit. A class rather than a generator: it runs on every call of a
    sub-millisecond attribution."""

    __slots__ = ("cudnn", "model", "params")

    def __init__(self, model: Any) -> None:
        self.model = model
        self.params: list[nn.Parameter] = []
        self.cudnn: Any = None

    def __enter__(self) -> None:
        if not isinstance(self.model, nn.Module):
            return
        anatomy = _anatomy(self.model)
        self.params = [p for p in anatomy.params if p.requires_grad]
        try:
            for p in self.params:
                p.requires_grad_(False)
            if anatomy.has_rnn and needs_cudnn_off(self.model):
                self.cudnn = torch.backends.cudnn.flags(enabled=False)
                self.cudnn.__enter__()
        except BaseException:
            self._restore()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            if self.cudnn is not None:
                self.cudnn.__exit__(*exc)
        finally:
            self._restore()

    def _restore(self) -> None:
        for p in self.params:
            p.requires_grad_(True)
