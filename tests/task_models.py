"""Small models of the tasks teams serve beside classifiers (CONTRACT 9.4), built in code with
fixed seeds: what models.toml's ``python:`` sources serve in the tests and the docs."""

from __future__ import annotations

import torch
from torch import nn

#: the segmenter's classes
SEGMENT_LABELS = ("background", "road", "car")


class Segmenter(nn.Module):
    """A fully convolutional segmenter: (N, 3, 16, 16) images -> (N, 3, 16, 16) logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(8, len(SEGMENT_LABELS), 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def segmenter() -> nn.Module:
    return Segmenter()


def regressor() -> nn.Module:
    """A house-price-like regression: [N, 5] features -> [N, 1] value."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))


def tagger() -> nn.Module:
    """A multi-label tagger: [N, 6] features -> 4 independent label logits."""
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4))
