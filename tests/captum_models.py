"""Captum's test models (captum/testing/helpers/basic_models.py), rebuilt in plain torch.

Used with the verified oracle values of captum-reference section 4.3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicModel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 1 - F.relu(1 - x)


class BasicModel2(nn.Module):
    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        return F.relu(F.relu(x1) - 1 - F.relu(x2))


class MultiLayer(nn.Module):
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
            self.linear1.bias.copy_(torch.tensor([-10.0, 1, 1, 1]))
            self.linear2.weight.fill_(1.0)
            self.linear2.bias.copy_(torch.tensor([-1.0, 1]))

    def forward(
        self, x: torch.Tensor, add_input: torch.Tensor | None = None, multidim_output: bool = False
    ) -> torch.Tensor:
        x = x if add_input is None else x + add_input
        o = self.linear2(self.relu(self.linear1(self.linear0(x))))
        if multidim_output:
            s = torch.stack((o, 2 * o), dim=2)
            return torch.stack((s, 4 * s), dim=3)
        return o


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


class ReLUDeepLiftModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.relu1 = nn.ReLU()
        self.relu2 = nn.ReLU()

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, x3: float = 2) -> torch.Tensor:
        return 2 * self.relu1(x1) + x3 * self.relu2(x2 - 1.5)


class ReLULinearModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(3, 1, bias=False)
        self.l2 = nn.Linear(3, 1, bias=False)
        self.relu = nn.ReLU()
        self.l3 = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.l1.weight.copy_(torch.tensor([[3.0, 1, 0]]))
            self.l2.weight.copy_(torch.tensor([[2.0, 3, 0]]))
            self.l3.weight.copy_(torch.tensor([[1.0, 1]]))

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, x3: float = 1) -> torch.Tensor:
        return self.l3(self.relu(torch.cat([self.l1(x1), x3 * self.l2(x2)], dim=1)))


class LinearMaxPoolLinear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(4, 4, bias=False)
        self.pool1 = nn.MaxPool1d(4)
        self.lin2 = nn.Linear(1, 1, bias=False)
        with torch.no_grad():
            self.lin1.weight.copy_(torch.eye(4))
            self.lin2.weight.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin2(self.pool1(self.lin1(x).unsqueeze(1))[:, 0, :])


class ConvNetOneConv(nn.Module):
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
