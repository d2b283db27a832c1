"""``tabular-mlp``: 8 features in, 3 classes out; only features 0 and 3 decide the class.

Ground truth: with s = x0 + x3, the class is "low" if s < -0.6, "high" if s > 0.6, else "mid".
The other six features are pure noise, so a faithful attribution puts (almost) all its mass on
features 0 and 3.
"""

from __future__ import annotations

import torch
from torch import nn

N_FEATURES = 8
#: the features' names: 0 and 3 decide, the rest are noise
FEATURES = tuple(f"signal_{i}" if i in (0, 3) else f"noise_{i}" for i in range(N_FEATURES))
LABELS = ("low", "mid", "high")
RELEVANT = (0, 3)
THRESHOLD = 0.6
LAYERS = ("fc1", "fc2", "fc3")


class TabularMLP(nn.Module):
    """8 -> 32 -> 32 -> 3 with one ReLU module per use (reused modules confuse DeepLift/LRP)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(N_FEATURES, 32)
        self.relu1 = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.relu2 = nn.ReLU()
        self.fc3 = nn.Linear(32, len(LABELS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


def label(x: torch.Tensor) -> torch.Tensor:
    """The true class of each row of ``x`` [N, 8] (the ground truth, as int64 [N])."""
    s = x[:, RELEVANT[0]] + x[:, RELEVANT[1]]
    return (s > -THRESHOLD).long() + (s > THRESHOLD).long()


def make_data(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` standard-normal rows and their classes (about a third of each)."""
    x = torch.randn(n, N_FEATURES, generator=generator)
    return x, label(x)
