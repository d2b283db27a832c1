"""Tiny models for ``python:`` sources in the service tests' models.toml."""

from __future__ import annotations

import torch
from torch import nn


class TwoInput(nn.Module):
    """Two named inputs [N, 3] and [N, 2] -> 2 classes: out = [a.sum() + 2 b0, a0 - b1]."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a.sum(dim=1) + 2 * b[:, 0], a[:, 0] - b[:, 1]], dim=1)


def two_input() -> nn.Module:
    return TwoInput()


def linear_script() -> torch.jit.ScriptModule:
    """A TorchScript linear model [N, 4] -> 2 classes (hook methods must be refused)."""
    torch.manual_seed(0)
    return torch.jit.script(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)))
