"""Tiny models for ``python:`` sources in the service tests' models.toml."""

from __future__ import annotations

import os
import time

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


class Slow(nn.Module):
    """[N, 2] -> 2 classes, sleeping 50 ms per forward: a request that takes a known while."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05)
        return self.fc(x)


def slow() -> nn.Module:
    torch.manual_seed(0)  # the same weights in every process (a restarted server too)
    return Slow()


class OffReference(nn.Module):
    """[N, 4] -> 2 classes whose output is perturbed whenever it does not run in float64: a
    fault that only shows off the float64 CPU reference path (the device check must see it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x)
        if x.dtype != torch.float64:
            out = out * 1.1 + 0.05 * x[:, :1] ** 2
        return out


def off_reference() -> nn.Module:
    torch.manual_seed(0)
    return OffReference()


class Faulty(nn.Module):
    """[N, 2] -> 2 classes, well-behaved on inputs in [-10, 10]; an input above 100 is a fault:
    ``mode`` "stuck" blocks forever (in C code, as far as Python can tell: no checkpoint is
    reached), "crash" ends the process at once."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(2, 2)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x > 100).any()):
            if self.mode == "crash":
                os._exit(3)
            time.sleep(3600)
        return self.fc(x)


def stuck() -> nn.Module:
    return Faulty("stuck")


def crashy() -> nn.Module:
    return Faulty("crash")


class Threads(nn.Module):
    """[N, 2] -> 2 classes whose outputs are the torch threads it computes on (each forward
    takes at least 5 ms: a batch big enough to share the cores by ``service.pool.cores``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.005)
        return self.fc(x) * 0 + torch.get_num_threads()


def threads() -> nn.Module:
    torch.manual_seed(0)
    return Threads()
