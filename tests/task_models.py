"""Small models of the tasks teams serve beside classifiers (CONTRACT 9.4), built in code with
fixed seeds: what models.toml's ``python:`` sources serve in the tests and the docs."""

from __future__ import annotations

from pathlib import Path

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


TOML = """  # the models of build(root)
[[models]]
id = "qa"
source = "hf:qa"

[[models]]
id = "topics"
source = "hf:multi_label"

[[models]]
id = "score"
source = "hf:regression"

[[models]]
id = "scene"
source = "hf:scene"
dtype = "float64"

[[models]]
id = "roads"
source = "python:tests.task_models:segmenter"
kind = "semantic_segmentation"
dtype = "float64"
inputs = [{name = "image", dtype = "float64", shape = ["N", 3, 16, 16]}]
labels = ["background", "road", "car"]
output_shape = [3, 16, 16]
layers = ["features"]

[[models]]
id = "price"
source = "python:tests.task_models:regressor"
kind = "regression"
dtype = "float64"
inputs = [{name = "x", dtype = "float64", shape = ["N", 5]}]

[[models]]
id = "tags"
source = "python:tests.task_models:tagger"
kind = "multi_label_classification"
dtype = "float64"
inputs = [{name = "x", dtype = "float64", shape = ["N", 6]}]
labels = ["a", "b", "c", "d"]
"""


def build(root: Path) -> str:
    """Under ``root``: a BERT question answerer, multi-label tagger and regressor and a
    SegFormer (``tests.hf_dirs``); the models.toml serving them and the models above."""
    from tests.hf_dirs import bert_task_dir, segformer_dir

    bert_task_dir(root / "qa", "qa")
    bert_task_dir(root / "multi_label", "multi_label")
    bert_task_dir(root / "regression", "regression")
    segformer_dir(root / "scene")
    return TOML
