"""Captum's test models (captum/testing/helpers/basic_models.py) rebuilt in plain torch.

They carry the oracle values of captum-reference §4.3; rebuilding them keeps the tests
independent of Captum's testing package.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MultiLayer(nn.Module):
    """BasicModel_MultiLayer: linear0 (I) -> linear1 (ones, b=[-10,1,1,1]) -> relu -> linear2."""

    def __init__(self) -> None:
        super().__init__()
        self.linear0 = nn.Linear(3, 3)
        self.linear1 = nn.Linear(3, 4)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(4, 2)
        with torch.no_grad():
            self.linear0.weight.copy_(torch.eye(3))
            self.linear0.bias.zero_()
            self.linear1.weight.fill_(1.0)
            self.linear1.bias.copy_(torch.tensor([-10.0, 1.0, 1.0, 1.0]))
            self.linear2.weight.fill_(1.0)
            self.linear2.bias.copy_(torch.tensor([-1.0, 1.0]))

    def forward(self, x: torch.Tensor, add_input: torch.Tensor | None = None) -> torch.Tensor:
        x = x if add_input is None else x + add_input
        return self.linear2(self.relu(self.linear1(self.linear0(x))))


class MultiInput(nn.Module):
    """BasicModel_MultiLayer_MultiInput: MultiLayer(scale * (x1 + x2 + x3))."""

    def __init__(self) -> None:
        super().__init__()
        self.model = MultiLayer()

    def forward(
        self, x1: torch.Tensor, x2: torch.Tensor, x3: torch.Tensor, scale: int
    ) -> torch.Tensor:
        return self.model(scale * (x1 + x2 + x3))


class BoolInput(nn.Module):
    """BasicModelBoolInput: MultiLayer(x.float() * 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = MultiLayer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.float() * 10)


class ConvNetOneConv(nn.Module):
    """BasicModel_ConvNet_One_Conv on 1x4x4 inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3, 1)
        self.relu1 = nn.ReLU()
        self.fc1 = nn.Linear(8, 4)
        self.relu2 = nn.ReLU()
        with torch.no_grad():
            self.conv1.weight.fill_(1.0)
            self.conv1.bias.copy_(torch.tensor([-50.0, -75.0]))
            self.fc1.weight.copy_(torch.cat([torch.ones(4, 5), -torch.ones(4, 3)], dim=1))
            self.fc1.bias.zero_()

    def forward(self, x: torch.Tensor, x2: torch.Tensor | None = None) -> torch.Tensor:
        if x2 is not None:
            x = x + x2
        x = self.relu1(self.conv1(x))
        return self.relu2(self.fc1(x.view(-1, 8)))


def functional_relu_model(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x)
