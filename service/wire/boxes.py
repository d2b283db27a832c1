"""Box targets of object detectors (CONTRACT 9.4): ``{"box": [x1, y1, x2, y2], "label": int |
label}`` (optionally ``"iou_threshold"``, default 0.5), or one per example; none: each
example's top detection. Coordinates are the model input's pixels.

Wire form: ``{"form": "box", "rows": [None | {"box": [...], "label": int} per example],
"iou_threshold": float}`` (None: the top detection, chosen in the worker).
"""

from __future__ import annotations

import math
from typing import Any

from model_registry.spec import OutputSpec
from service.core.errors import InvalidRequest, Loc
from service.core.work import WireTarget
from service.wire import regions

LOC: Loc = ("body", "target")
SHAPE = '{"box": [x1, y1, x2, y2], "label": "car"}'
IOU_THRESHOLD = 0.5


def resolve(raw: Any, out: OutputSpec, n: int) -> WireTarget:
    """The wire form of a detector's ``target``."""
    if raw is None:
        return {"form": "box", "rows": [None] * n, "iou_threshold": IOU_THRESHOLD}
    each = regions.per_example(raw, n, lambda t, loc: _one(t, out, loc))
    thresholds = {t for _, t in each}
    if len(thresholds) != 1:
        raise InvalidRequest("give every example the same iou_threshold", loc=LOC)
    return {"form": "box", "rows": [r for r, _ in each], "iou_threshold": thresholds.pop()}


def _one(raw: Any, out: OutputSpec, loc: Loc) -> tuple[dict[str, Any], float]:
    if not isinstance(raw, dict) or not {"box", "label"} <= set(raw) <= {
        "box", "label", "iou_threshold"
    }:  # fmt: skip
        raise InvalidRequest(f"a detector's target is a box and a label, e.g. {SHAPE}", loc=loc)
    box = raw["box"]
    ok = isinstance(box, list) and len(box) == 4 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box
    )  # fmt: skip
    if not ok or box[2] <= box[0] or box[3] <= box[1]:
        raise InvalidRequest(
            f"a box is [x1, y1, x2, y2] in the input's pixels, x2 > x1 and y2 > y1; got {box!r}",
            loc=(*loc, "box"),
        )
    label = raw["label"]
    if isinstance(label, str):
        if label not in out.labels:
            known = f"the labels are {list(out.labels)}" if out.labels else "it has no labels"
            raise InvalidRequest(f"unknown label {label!r}; {known}", loc=(*loc, "label"))
        label = out.labels.index(label)
    elif isinstance(label, bool) or not isinstance(label, int) or label < 0 or (
        out.labels and label >= len(out.labels)
    ):  # fmt: skip
        top = f" (0..{len(out.labels) - 1})" if out.labels else ""
        raise InvalidRequest(
            f"label must be a class id{top} or a label name, got {label!r}", loc=(*loc, "label")
        )
    threshold = raw.get("iou_threshold", IOU_THRESHOLD)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not (
        0 < threshold <= 1
    ):  # fmt: skip
        raise InvalidRequest(
            f"iou_threshold is a number in (0, 1], got {threshold!r}", loc=(*loc, "iou_threshold")
        )
    return {"box": [float(v) for v in box], "label": int(label)}, float(threshold)
