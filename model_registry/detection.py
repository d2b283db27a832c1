"""Object detectors served as tensor models (CONTRACT 9.4): a detector returns, per image, its
detections (torchvision's list of ``{"boxes", "labels", "scores"}``: Faster R-CNN, RetinaNet,
SSD; or a Hugging Face ``*ForObjectDetection`` output, DETR-style ``logits`` and normalised
``pred_boxes``); ``BoxScore`` makes it a model of one score per image: the score of the
detection matching a wanted box and label.

The rule is pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` as CONTRACT 9.4 takes it: among
the image's detections of the wanted label, the one with the largest IoU with the wanted box;
its score where that IoU reaches ``iou_threshold`` (0.5), else 0 (grad-cam's own rule takes
the best-IoU detection of any label and adds its IoU to its score). Each forward detects
afresh, so a perturbed image is scored by its own detections: what perturbation methods
attribute, and, where the detector is differentiable, gradient methods too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

#: a Hugging Face detector's detections reported in answers: its post-processing's default
REPORTED_SCORE = 0.5
#: the most detections an answer lists per image (torchvision's ``detections_per_img``)
MOST_REPORTED = 100


def box_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of every box of ``a`` (A, 4) with every box of ``b`` (B, 4), xyxy (torchvision's
    ``box_iou``)."""
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=2)
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-12), torch.zeros_like(inter))


def box_score(det: dict[str, Tensor], box: Tensor, label: Tensor, iou_threshold: float) -> Tensor:
    """The score of ``det``'s detection of ``label`` best overlapping ``box`` (0 where none
    reaches ``iou_threshold``), connected to the detector's graph either way."""
    scores = det["scores"]
    zero = scores.sum() * 0 if scores.numel() else scores.new_zeros(())
    same = det["labels"] == label.to(det["labels"].device)
    if not bool(same.any()):
        return zero
    ious = box_iou(box.to(det["boxes"].dtype).reshape(1, 4), det["boxes"][same])[0]
    best = int(ious.argmax())
    if float(ious[best].detach()) < iou_threshold:
        return zero
    return scores[same][best] + zero


def _hf(out: Any, images: Tensor) -> list[dict[str, Tensor]]:
    """A DETR-style output: per query, the most likely class but "no object" (the last), its
    probability, and its box (normalised centre, width, height) in the input's pixels."""
    probs = out.logits.softmax(-1)[..., :-1]
    scores, labels = probs.max(-1)
    cx, cy, w, h = out.pred_boxes.unbind(-1)
    height, width = images.shape[-2:]
    boxes = torch.stack(
        [(cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height],
        dim=-1,
    )
    return [
        {"boxes": b, "labels": c, "scores": s}
        for b, c, s in zip(boxes, labels, scores, strict=True)
    ]


def detections_of(out: Any, images: Tensor) -> list[dict[str, Tensor]]:
    """A detector's output as one dict of ``boxes`` (K, 4), ``labels`` (K,) and ``scores``
    (K,) per image; TypeError saying what it gave otherwise."""
    if hasattr(out, "logits") and hasattr(out, "pred_boxes"):
        return _hf(out, images)
    if isinstance(out, Sequence) and all(isinstance(d, dict) for d in out):
        dets = list(out)
        for d in dets:
            if not {"boxes", "labels", "scores"} <= set(d):
                raise TypeError(
                    f"a detection dict holds boxes, labels and scores; got keys {sorted(d)}"
                )
        if len(dets) != images.shape[0]:
            raise TypeError(f"{len(dets)} detection dicts for {images.shape[0]} images")
        return dets
    raise TypeError(
        "a detector returns a list of {boxes, labels, scores} per image (torchvision's form) "
        f"or a DETR-style output with logits and pred_boxes; got {type(out).__name__}"
    )


class BoxScore(nn.Module):
    """A detector as a model of one score per image: ``forward(images, boxes, labels,
    iou_threshold)`` (boxes (N, 4) xyxy in the input's pixels, labels (N,)), each image's
    ``box_score``; without boxes, each image's top detection (its highest score)."""

    def __init__(self, model: nn.Module, hf: bool = False) -> None:
        super().__init__()
        self.model, self.hf = model, hf

    def detect(self, images: Tensor) -> list[dict[str, Tensor]]:
        out = self.model(pixel_values=images) if self.hf else self.model(images)
        return detections_of(out, images)

    def forward(
        self,
        images: Tensor,
        boxes: Tensor | None = None,
        labels: Tensor | None = None,
        iou_threshold: float = 0.5,
    ) -> Tensor:
        dets = self.detect(images)
        if boxes is None or labels is None:
            return torch.stack([d["scores"].max() if d["scores"].numel() else
                                d["scores"].new_zeros(()) for d in dets])  # fmt: skip
        return torch.stack(
            [box_score(d, boxes[i], labels[i], float(iou_threshold)) for i, d in enumerate(dets)]
        )


def reported(det: dict[str, Tensor], hf: bool) -> dict[str, list[Any]]:
    """What an answer lists of an image's detections: best first, at most ``MOST_REPORTED``
    (a Hugging Face detector's over ``REPORTED_SCORE``, as its post-processing keeps)."""
    order = det["scores"].detach().argsort(descending=True)[:MOST_REPORTED]
    if hf:
        order = order[det["scores"].detach()[order] >= REPORTED_SCORE]
    return {
        "boxes": det["boxes"].detach()[order].double().cpu().tolist(),
        "labels": det["labels"].detach()[order].cpu().tolist(),
        "scores": det["scores"].detach()[order].double().cpu().tolist(),
    }
