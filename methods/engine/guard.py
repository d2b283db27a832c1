"""Leave the caller's model exactly as it was found.

During an attribution the parameters stop requiring grad (we only ever differentiate with
respect to inputs or activations, so weight gradients would be wasted work and memory); the
training flags, requires_grad flags and hook dictionaries are restored in ``finally``.
On CUDA, recurrent modules in eval mode cannot run cuDNN's backward, so cuDNN is switched off
for the duration (the FAQ's workaround, done for the user).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def is_torchscript(model: Any) -> bool:
    return isinstance(model, (torch.jit.ScriptModule, torch.jit.ScriptFunction))


def needs_cudnn_off(model: nn.Module) -> bool:
    """True when cuDNN's RNN backward would refuse to run (RNN modules on a CUDA device)."""
    on_cuda = any(p.is_cuda for p in model.parameters())
    return on_cuda and any(isinstance(m, nn.RNNBase) for m in model.modules())


@contextlib.contextmanager
def model_guard(model: Any) -> Iterator[None]:
    if not isinstance(model, nn.Module):
        yield
        return
    params = [p for p in model.parameters() if p.requires_grad]
    modes = [(m, m.training) for m in model.modules()]
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
        for m, training in modes:
            if m.training != training:
                m.train(training)
