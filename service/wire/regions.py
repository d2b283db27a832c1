"""Region targets of segmentation models (CONTRACT 9.4): ``{"class": int | label, "region":
"predicted" | mask}``, or one per example: the sum of the class's logits over the region, as
Captum's segmentation tutorial attributes them (``"predicted"``: the pixels whose argmax is
the class, fixed from the unperturbed output; a mask: H×W of 0/1 on the output's pixels).

Without a target, each example's dominant class (the one it predicts on the most pixels) over
its predicted pixels. Wire form: ``{"form": "region", "rows": [class (None: dominant) per
example], "masks": None | [mask per example]}`` (None: predicted; each mask a list of rows of
0/1). The engine's form is
``{"class": [...], "region": "predicted" | tensor (N, H, W)}`` (``methods.attribute``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from methods.engine.targets import make_target, predicted_regions
from model_registry.spec import OutputSpec
from service.core.errors import InvalidRequest, Loc
from service.core.work import WireTarget

LOC: Loc = ("body", "target")
SHAPE = '{"class": 3, "region": "predicted"} or {"class": "road", "region": [[0, 1, ...], ...]}'


def resolve(raw: Any, out: OutputSpec, n: int) -> WireTarget:
    """The wire form of a segmentation model's ``target``: one for every example, or a list
    with one per example."""
    if raw is None:  # each example's dominant class over its pixels (fixed in the worker)
        return {"form": "region", "rows": [None] * n, "masks": None}
    each = per_example(raw, n, lambda t, loc: _one(t, out, loc))
    masks = [m for _, m in each]
    if any(m is None for m in masks) and any(m is not None for m in masks):
        raise InvalidRequest(
            'give every example a mask, or every example "predicted", not a mix', loc=LOC
        )
    return {
        "form": "region",
        "rows": [c for c, _ in each],
        "masks": None if masks[0] is None else masks,
    }


T = TypeVar("T")


def per_example(raw: Any, n: int, one: Callable[[Any, Loc], T]) -> list[T]:
    """An object target read by ``one``: a list of them, one per example, or one for all."""
    if isinstance(raw, list) and all(isinstance(t, dict) for t in raw):
        if len(raw) != n:
            raise InvalidRequest(
                f"a list target needs one entry per example: got {len(raw)} for {n} examples",
                loc=LOC,
            )
        return [one(t, (*LOC, i)) for i, t in enumerate(raw)]
    return [one(raw, LOC)] * n


def _one(raw: Any, out: OutputSpec, loc: Loc) -> tuple[int, list[list[int]] | None]:
    if not isinstance(raw, dict) or set(raw) != {"class", "region"}:
        raise InvalidRequest(
            f"a segmentation model's target is a class over a region, e.g. {SHAPE}; got "
            f"{json.dumps(raw)[:200]}",
            loc=loc,
        )
    c, region = raw["class"], raw["region"]
    classes = out.shape[0]
    if isinstance(c, str):
        if c not in out.labels:
            raise InvalidRequest(
                f"unknown class {c!r}; the classes are {list(out.labels)}", loc=(*loc, "class")
            )
        c = out.labels.index(c)
    elif isinstance(c, bool) or not isinstance(c, int) or c < 0 or (
        classes is not None and c >= classes
    ):  # fmt: skip
        names = f" or {list(out.labels)}" if out.labels else ""
        raise InvalidRequest(
            f"class {c!r} is out of range: the model has classes 0..{classes - 1}{names}"
            if classes is not None
            else f"class must be an int from 0 or a label, got {c!r}",
            loc=(*loc, "class"),
        )
    if region == "predicted":
        return int(c), None
    return int(c), _mask(region, out, (*loc, "region"))


def _mask(raw: Any, out: OutputSpec, loc: Loc) -> list[list[int]]:
    """An H×W mask of 0/1 on the output's pixels, checked."""
    spatial = tuple(out.shape[1:])
    want = "×".join("H" if d is None else str(d) for d in spatial)
    try:
        mask = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        mask = np.zeros(0)
    if isinstance(raw, str) or mask.ndim != len(spatial) or not mask.size:
        raise InvalidRequest(
            f'a region is "predicted" or a mask of {want} 0/1 values on the output\'s pixels',
            loc=loc,
        )
    if any(d is not None and d != m for d, m in zip(spatial, mask.shape, strict=True)):
        raise InvalidRequest(
            f"the mask is {'×'.join(map(str, mask.shape))}; the model's output has {want} pixels",
            loc=loc,
        )
    if not np.isin(mask, (0.0, 1.0)).all():
        raise InvalidRequest("a mask holds 0 (outside) and 1 (inside) only", loc=loc)
    if not mask.any():
        raise InvalidRequest("the mask is empty: no pixel is inside the region", loc=loc)
    return mask.astype(np.int8).tolist()


def dominant(t: dict[str, Any], out: torch.Tensor) -> dict[str, Any]:
    """``t`` with each example that names no class given the class its output predicts on
    the most pixels (ties: the lowest class)."""
    if all(c is not None for c in t["rows"]):
        return t
    predicted = out.argmax(dim=1).flatten(1)  # (N, pixels)
    counts = torch.zeros(out.shape[0], out.shape[1], dtype=torch.long, device=out.device)
    counts.scatter_add_(1, predicted, torch.ones_like(predicted))
    most = counts.argmax(dim=1).tolist()
    return {**t, "rows": [m if c is None else c for c, m in zip(t["rows"], most, strict=True)]}


def to_engine(t: dict[str, Any]) -> dict[str, Any]:
    masks = t["masks"]
    region: Any = "predicted" if masks is None else torch.tensor(masks, dtype=torch.float32)
    return {"class": list(t["rows"]), "region": region}


def select(out: torch.Tensor, target: dict[str, Any]) -> torch.Tensor:
    """Each example's class summed over its region, in ``out`` (the unperturbed output)."""
    engine = predicted_regions(make_target(target, out.shape[0]), out)
    return engine.select(out)


def masks(out: torch.Tensor, target: dict[str, Any]) -> np.ndarray:
    """Each example's region (N, H, W; true inside) for the engine ``target``, in ``out``."""
    engine = predicted_regions(make_target(target, out.shape[0]), out)
    weights = engine.weights
    if weights is None:
        raise TypeError("a fixed region target carries its weights")
    return (weights > 0).cpu().numpy()


def concat(parts: list[WireTarget]) -> WireTarget:
    """Region targets of requests merged into one batch (all predicted, or all masks)."""
    rows = [c for t in parts if t is not None for c in t["rows"]]
    first = parts[0]
    if first is None or first["masks"] is None:
        return {"form": "region", "rows": rows, "masks": None}
    masks = [m for t in parts if t is not None for m in t["masks"]]
    return {"form": "region", "rows": rows, "masks": masks}


def form(t: dict[str, Any]) -> Any:
    """What must be equal for requests to merge: predicted regions, or masks of one shape."""
    if t["masks"] is None:
        return ("region", "predicted")
    digest = hashlib.sha1(json.dumps(np.shape(t["masks"][0])).encode()).hexdigest()[:8]
    return ("region", digest)
