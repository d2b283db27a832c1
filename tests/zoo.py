"""The test model matrix: small models built in code, shared by every engine test.

Each entry builds a model and example inputs in float64 and names the target and extra
arguments to use, so the parity, conformance and axiom suites can all iterate over it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Case:
    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...] | torch.Tensor
    target: Any
    additional_forward_args: Any = None
    baselines: Any = None
    #: dotted paths of layers worth attributing to (layer and neuron methods)
    layers: tuple[str, ...] = ()
    tags: set[str] = field(default_factory=set)


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (6, 16, 16, 3)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """Conv -> ReLU -> MaxPool -> Conv -> Tanh -> AvgPool -> Linear, on (3, 8, 8)."""

    def __init__(self, n_out: int = 4) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.act2 = nn.Tanh()
        self.pool2 = nn.AvgPool2d(2)
        self.fc = nn.Linear(6 * 2 * 2, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.act2(self.conv2(x)))
        return self.fc(x.flatten(1))


class TwoInput(nn.Module):
    """Two tensor inputs plus a scale passed through additional_forward_args."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(3, 8)
        self.relu = nn.ReLU()
        self.sig = nn.Sigmoid()
        self.out = nn.Linear(8, 3)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        h = self.relu(self.a(x1)) + self.sig(self.b(x2))
        return self.out(h) * scale


class MultiDim(nn.Module):
    """Output (N, 2, 3): targets are index tuples."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 6)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.lin(x)).view(-1, 2, 3)


class ModuleTwin(nn.Module):
    """Every non-linearity is its own nn.Module, each used once (Captum's happy path)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(5, 8)
        self.r1 = nn.ReLU()
        self.l2 = nn.Linear(8, 8)
        self.s2 = nn.Sigmoid()
        self.l3 = nn.Linear(8, 8)
        self.t3 = nn.Tanh()
        self.l4 = nn.Linear(8, 8)
        self.r4 = nn.ReLU()
        self.l5 = nn.Linear(8, 3)
        self.sm = nn.Softmax(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.r1(self.l1(x))
        h = self.s2(self.l2(h))
        h = self.t3(self.l3(h))
        h = self.r4(self.l4(h))
        return self.sm(self.l5(h))


class FunctionalTwin(ModuleTwin):
    """The same weights, with functional non-linearities and one ReLU module reused."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.r1(self.l1(x))
        h = torch.sigmoid(self.l2(h))
        h = torch.tanh(self.l3(h))
        h = self.r1(self.l4(h))  # r1 reused
        return F.softmax(self.l5(h), dim=1)


class ConvModuleTwin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(3 * 3 * 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.relu(self.conv(x))).flatten(1))


class ConvFunctionalTwin(ConvModuleTwin):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


def _seeded(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _init(model: nn.Module, seed: int) -> nn.Module:
    g = _seeded(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.7)
    return model.double().eval()


def _x(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=_seeded(seed), dtype=torch.float64)


def cases() -> list[Case]:
    """Fresh instances of every case (tests may not share mutable models)."""
    return [
        Case("mlp", _init(MLP(), 1), _x((4, 6), 2), [0, 2, 1, 2], layers=("net.0", "net.2")),
        Case(
            "cnn",
            _init(CNN(), 3),
            _x((3, 3, 8, 8), 4),
            1,
            layers=("conv1", "pool1", "conv2"),
            tags={"conv"},
        ),
        Case(
            "two_input",
            _init(TwoInput(), 5),
            (_x((3, 4), 6), _x((3, 3), 7)),
            [2, 0, 1],
            additional_forward_args=(0.5,),
            baselines=(0.1, _x((1, 3), 8)),
            layers=("a", "out"),
            tags={"multi_input"},
        ),
        Case(
            "multidim",
            _init(MultiDim(), 9),
            _x((3, 5), 10),
            [(0, 1), (1, 2), (1, 0)],
            layers=("lin",),
            tags={"multidim"},
        ),
        Case("module_twin", _init(ModuleTwin(), 11), _x((4, 5), 12), 2, layers=("l2", "l4")),
        Case(
            "conv_twin",
            _init(ConvModuleTwin(), 13),
            _x((2, 2, 6, 6), 14),
            1,
            layers=("conv",),
            tags={"conv"},
        ),
    ]


def twins() -> list[tuple[nn.Module, nn.Module, torch.Tensor, Any]]:
    """(module model, functional twin with identical weights, inputs, target)."""
    out: list[tuple[nn.Module, nn.Module, torch.Tensor, Any]] = []
    for mod_cls, fn_cls, x, seed in (
        (ModuleTwin, FunctionalTwin, _x((4, 5), 20), 21),
        (ConvModuleTwin, ConvFunctionalTwin, _x((2, 2, 6, 6), 22), 23),
    ):
        a = _init(mod_cls(), seed)
        b = fn_cls().double().eval()
        b.load_state_dict(a.state_dict())
        out.append((a, b, x, 1))
    return out


def by_name(name: str) -> Case:
    return next(c for c in cases() if c.name == name)


Builder = Callable[[], Case]
