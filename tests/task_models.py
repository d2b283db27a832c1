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


#: the detector's classes
DETECT_LABELS = ("person", "bicycle", "car")


class Detector(nn.Module):
    """A one-stage detector in torchvision's output format: (N, 3, 32, 32) images -> a list of
    ``{"boxes" (K, 4) xyxy, "labels" (K,), "scores" (K,)}``, one per image. Sixteen anchors
    (8x8 cells), each with class logits (three classes and background) and box offsets; kept
    where the best class's softmax score exceeds 0.05, best first (as torchvision's
    ``box_score_thresh``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(8))
        self.classes = nn.Conv2d(8, len(DETECT_LABELS) + 1, 1)
        self.offsets = nn.Conv2d(8, 4, 1)
        cells = torch.arange(4, dtype=torch.float32) * 8
        y, x = torch.meshgrid(cells, cells, indexing="ij")
        self.register_buffer("anchors", torch.stack([x, y, x + 8, y + 8], -1).reshape(-1, 4))

    def forward(self, images: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        h = self.backbone(images)
        probs = self.classes(h).flatten(2).transpose(1, 2).softmax(-1)[..., 1:]  # (N, 16, 3)
        boxes = self.anchors + 4 * torch.tanh(self.offsets(h).flatten(2).transpose(1, 2))
        scores, labels = probs.max(-1)
        out = []
        for i in range(images.shape[0]):
            keep = scores[i] > 0.05
            order = scores[i][keep].argsort(descending=True)
            out.append({"boxes": boxes[i][keep][order], "labels": labels[i][keep][order],
                        "scores": scores[i][keep][order]})  # fmt: skip
        return out


def detector() -> nn.Module:
    return Detector()


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
id = "cars"
source = "python:tests.task_models:detector"
kind = "object_detection"
dtype = "float64"
inputs = [{name = "image", dtype = "float64", shape = ["N", 3, 32, 32]}]
labels = ["person", "bicycle", "car"]

[[models]]
id = "pets"
source = "hf:pets"

[[models]]
id = "match"
source = "hf:clip"

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
    from tests.hf_dirs import bert_task_dir, clip_dir, segformer_dir, yolos_dir

    bert_task_dir(root / "qa", "qa")
    bert_task_dir(root / "multi_label", "multi_label")
    bert_task_dir(root / "regression", "regression")
    segformer_dir(root / "scene")
    yolos_dir(root / "pets")
    clip_dir(root / "clip")
    return TOML


def main(argv: list[str] | None = None) -> None:
    import argparse

    from tests.hf_dirs import sample_photo

    parser = argparse.ArgumentParser(
        prog="python -m tests.task_models",
        description="Build the task models' Hugging Face directories (qa, multi_label, "
        "regression, scene, pets), a photo and a models.toml serving them with the models of "
        "code (roads, price, tags, cars); print the models.toml's path.",
    )
    parser.add_argument("root", nargs="?", default="tasks-demo", type=Path)
    root = parser.parse_args(argv).root
    root.mkdir(parents=True, exist_ok=True)
    (root / "models.toml").write_text(build(root))
    sample_photo().save(root / "photo.png")
    print(root / "models.toml")


if __name__ == "__main__":
    main()
