"""Object detectors (CONTRACT 9.4): images in, detections out, served as one score per image
(``model_registry.detection.BoxScore``): the score of the detection matching the target's box
and label, which every perturbation method (and, where the detector is differentiable, every
gradient method on the inputs) attributes. The target is fixed from the unperturbed image in
the worker (each example's top detection where none is given; a given box must match a
detection of its label, or the request is a 422 naming it); the answer carries each image's
detections.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from model_registry.detection import box_iou, reported
from model_registry.spec import LoadedModel, ModelSpec
from service.core.errors import InvalidRequest
from service.core.settings import Settings
from service.core.work import Attribution, Prediction, Reply, Work, retyped, runs
from service.kinds import tensors
from service.kinds.attribution import AttributionRules
from service.kinds.base import Catalogue
from service.kinds.tensor import TensorKind, attribute


@dataclass(kw_only=True)
class Detecting(Attribution):
    """Attributions of a detector's score for a box."""

    label: ClassVar[str] = "attribution"


@dataclass(kw_only=True)
class Detect(Prediction):
    """A detector's predictions: each image's top score and its detections."""


class DetectionRules(AttributionRules):
    work = Detecting


class DetectionKind(TensorKind):
    name = "object_detection"
    rules = DetectionRules()

    def describe(self, spec: ModelSpec) -> Catalogue:
        own = super().describe(spec)
        return dataclasses.replace(own, target=None)  # each example's top detection

    def predict_work(
        self, settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str
    ) -> Prediction:
        work = super().predict_work(settings, spec, inputs, deadline, request_id)
        return retyped(work, Detect)


def _hf(lm: LoadedModel) -> bool:
    return bool(getattr(lm.model, "hf", False))


def _chosen(dets: list[dict[str, torch.Tensor]], target: dict[str, Any]) -> list[dict[str, Any]]:
    """Each example's box and label: as given (checked to match a detection of its label),
    or its top detection."""
    threshold = float(target["iou_threshold"])
    out = []
    for i, (row, det) in enumerate(zip(target["rows"], dets, strict=True)):
        if row is None:
            if det["scores"].numel() == 0:
                raise InvalidRequest(
                    f"example {i}: the model detects nothing, so there is no top detection to "
                    'explain; give a target {"box": [x1, y1, x2, y2], "label": ...}',
                    loc=("body", "target"),
                )
            k = int(det["scores"].detach().argmax())
            out.append({"box": det["boxes"][k].detach().double().cpu().tolist(),
                        "label": int(det["labels"][k])})  # fmt: skip
            continue
        box = torch.tensor(row["box"], dtype=torch.float64)
        same = det["labels"].cpu() == row["label"]
        best = 0.0
        if bool(same.any()):
            boxes = det["boxes"].detach().double().cpu()[same]
            best = float(box_iou(box.reshape(1, 4), boxes).max())
        if best < threshold:
            where = ("body", "target", i) if len(target["rows"]) > 1 else ("body", "target")
            raise InvalidRequest(
                f"example {i}: the box matches no detection of label {row['label']} (the best "
                f"IoU is {best:.3f}, under iou_threshold {threshold})",
                loc=(*where, "box"),
            )
        out.append(row)
    return out


def _detected(lm: LoadedModel, work: Work) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
    """The work's images on the model's device, and their detections."""
    xs, _ = tensors.inputs(lm, work)
    with torch.no_grad():
        return xs[0], lm.model.detect(xs[0])


@runs(Detecting)
def attribute_detection(lm: LoadedModel, work: Detecting) -> Reply:
    t0 = time.perf_counter()
    images, dets = _detected(lm, work)
    chosen = _chosen(dets, work.target)  # type: ignore[arg-type]
    threshold = float(work.target["iou_threshold"])  # type: ignore[index]
    boxes = np.array([c["box"] for c in chosen], dtype=np.float64)
    labels = np.array([c["label"] for c in chosen], dtype=np.int64)
    args = (boxes, labels, threshold)
    scored = dataclasses.replace(
        work, target=None, params={**work.params, "additional_forward_args": args}
    )
    reply = attribute(lm, scored)
    with torch.no_grad():  # each example's score for its box, unperturbed
        at = tensors.convert(args, lm.device)
        reply.outputs = tensors.numpy(lm.model(images, *at))
    reply.target = chosen
    reply.study = {"detections": [reported(d, _hf(lm)) for d in dets]}
    reply.study_rows = ["detections"]
    reply.compute_ms = (time.perf_counter() - t0) * 1e3
    return reply


@runs(Detect)
def detect(lm: LoadedModel, work: Detect) -> Reply:
    t0 = time.perf_counter()
    _, dets = _detected(lm, work)
    top = [float(d["scores"].max()) if d["scores"].numel() else 0.0 for d in dets]
    return Reply(
        work_id=work.id,
        predictions=np.array(top, dtype=np.float64),
        study={"detections": [reported(d, _hf(lm)) for d in dets]},
        study_rows=["detections"],
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )
