"""Pictures of a reply's attributions (README, "Pictures"): which examples and inputs to draw, and
what to draw them over; the drawing itself is ``service.serving.render``."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from PIL import Image

from model_registry import hf_image
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest
from service.core.work import Reply, Work
from service.serving import render, waterfall
from service.wire.attributions import RenderSpec

#: the most pictures one response carries
MAX_RENDERS = 32
LOC = ("body", "render")
MEDIA = {"png": "image/png", "html": "text/html"}
#: the longest side an original image is drawn at (larger ones are scaled down to it)
MAX_ORIGINAL = render.MAX_SIDE - 64


def accepted(accept: str | None) -> str | None:
    """The picture format the Accept header prefers over JSON ("png", "html"), if any."""
    if not accept:
        return None
    best, best_q = None, 0.0
    for part in accept.split(","):  # the highest q wins; on a tie, the first listed
        media, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        fmt = {"image/png": "png", "text/html": "html"}.get(media.lower())
        if media.lower() in ("application/json", "application/*", "*/*"):
            fmt = "json"
        if fmt is not None and q > best_q:
            best, best_q = fmt, q
    return None if best in (None, "json") else best


def examples(spec: RenderSpec, n: int, inputs: int = 1) -> list[int]:
    """The examples to draw, checked before any work is done (with the colormap)."""
    if spec.colormap is not None:
        try:
            render.colormap(spec.colormap)
        except render.RenderError as exc:
            raise InvalidRequest(str(exc), loc=(*LOC, "colormap")) from None
    chosen = list(range(n)) if spec.examples is None else spec.examples
    for k, i in enumerate(chosen):
        if not 0 <= i < n:
            raise InvalidRequest(
                f"render.examples[{k}] is {i}; the request has {n} examples (0..{n - 1})",
                loc=(*LOC, "examples", k),
            )
    if spec._single and len(chosen) * inputs != 1:
        raise InvalidRequest(
            f"Accept: {MEDIA[spec.format]} answers with one picture, and this request would "
            f"draw {len(chosen) * inputs}: send one example, or choose one with render.examples"
            + (" (multi-input models: ask for JSON renders)" if inputs > 1 else ""),
            loc=(*LOC, "examples"),
        )
    if len(chosen) > MAX_RENDERS:
        raise InvalidRequest(
            f"render draws at most {MAX_RENDERS} examples; choose some with render.examples",
            loc=(*LOC, "examples"),
        )
    return chosen


def draw(
    spec: RenderSpec, model: ModelSpec, work: Work, reply: Reply, title: str
) -> list[dict[str, Any]]:
    """One picture per chosen example (and per input, on multi-input models)."""
    out: list[dict[str, Any]] = []
    names = [i.name for i in model.inputs]
    for i in examples(spec, work.n, len(model.inputs)):
        for k, attrs in enumerate(reply.attributions):
            attr = np.asarray(attrs[i], dtype=np.float64)
            tokens = None
            image = None
            marks = _marks(reply, i, k)
            if reply.tokens is not None:
                tokens = reply.tokens[i]
                attr = attr[: len(tokens)]
            elif work.images and (placed := on_original(model, work.images[i], attr)) is not None:
                attr, image, frame = placed
                marks = _on_frame(marks, frame, tuple(model.inputs[0].shape[-2:]), attr.shape)
            elif (src := 0 if reply.layers is not None else k) < len(work.arrays):
                x = work.arrays[src][i]  # a list of layers maps onto the first input each
                # the input under the map: only where the map has its (spatial) shape
                if x.shape[-attr.ndim :] == attr.shape or x.shape[-2:] == attr.shape[-2:]:
                    image = x.astype(np.float64)
            if spec.kind == "overlay" and tokens is None and image is None:
                raise InvalidRequest(
                    f"render.kind overlay draws over the input, but the attributions have shape "
                    f"{list(attr.shape)}, not the input's spatial shape; for a layer method set "
                    "params.interpolate_to_input",
                    loc=(*LOC, "kind"),
                )
            target = "" if reply.target is None else f" · {_named(model, reply.target[i])}"
            if spec.kind == "waterfall":
                pic = _waterfall(spec, model, reply, i, k, attr, tokens, title + target)
                out.append(_entry(reply, names, i, k, pic))
                continue
            try:
                columns = model.inputs[k].features if k < len(model.inputs) else None
                pic = render.draw(
                    spec,
                    attr,
                    inputs=image,
                    tokens=tokens,
                    feature_names=list(columns) if columns and attr.ndim == 1 else None,
                    title=title + target,
                    marks=marks,
                )
            except render.RenderError as exc:
                raise InvalidRequest(f"render: {exc}", loc=LOC) from None
            out.append(_entry(reply, names, i, k, pic))
    return out


def _entry(reply: Reply, names: list[str], i: int, k: int, pic: render.Rendered) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "example": i,
        "media_type": pic.media_type,
        "b64": base64.b64encode(pic.data).decode("ascii"),
    }
    if reply.layers is not None:  # a list of layers: one picture per layer
        entry["layer"] = _layer_of(reply, k)
    elif len(reply.attributions) > 1:
        entry["input"] = names[k] if k < len(names) else str(k)
    return entry


def _waterfall(
    spec: RenderSpec,
    model: ModelSpec,
    reply: Reply,
    i: int,
    k: int,
    attr: np.ndarray,
    tokens: list[str] | None,
    title: str,
) -> render.Rendered:
    """Example ``i``'s waterfall from its base value to its output (shap's): tokens, or
    the features of a tabular input."""
    loc = (*LOC, "kind")
    if reply.base_values is None or reply.outputs is None:
        raise InvalidRequest(
            "render.kind waterfall builds from the base value to the output: it needs a "
            "Shapley-family method (shapley_values, shapley_value_sampling, kernel_shap, "
            "partition), whose answers carry base_values",
            loc=loc,
        )
    base = np.asarray(reply.base_values[i], dtype=np.float64).reshape(-1)
    output = np.asarray(reply.outputs[i], dtype=np.float64).reshape(-1)
    if len(reply.attributions) > 1:
        raise InvalidRequest(
            "render.kind waterfall draws the attributions of one input from the base value to "
            "the output; this model's are split over several inputs (or layers): use heatmap",
            loc=loc,
        )
    if base.size != 1 or output.size != 1 or (tokens is None and attr.ndim != 1):
        raise InvalidRequest(
            "render.kind waterfall draws one target's attributions over tabular features or "
            f"tokens; these have shape {list(attr.shape)} per example (a top_k target, or an "
            "image: use heatmap or overlay)",
            loc=loc,
        )
    columns = model.inputs[k].features if k < len(model.inputs) else None
    names = tokens if tokens is not None else list(columns or [f"f{j}" for j in range(attr.size)])
    try:
        return waterfall.draw(spec, attr, list(names), float(base[0]), float(output[0]), title,
                              spec.width)  # fmt: skip
    except render.RenderError as exc:
        raise InvalidRequest(f"render: {exc}", loc=LOC) from None


def _marks(reply: Reply, i: int, k: int) -> render.Marks | None:
    """Example ``i``'s outlines (on input ``k``): its segmentation region, its detection
    target's box, the segments its answer credits."""
    region = None if reply.regions is None else np.asarray(reply.regions[i], dtype=bool)
    segments = None
    if reply.segments is not None and k < len(reply.segments):
        segments = np.asarray(reply.segments[k][i], dtype=np.int64)
    target = None if reply.target is None else reply.target[i]
    boxes: tuple[tuple[float, float, float, float], ...] = ()
    if isinstance(target, dict) and isinstance(target.get("box"), list):
        x1, y1, x2, y2 = (float(v) for v in target["box"])
        boxes = ((x1, y1, x2, y2),)
    if region is None and not boxes and segments is None:
        return None
    return render.Marks(region, boxes, segments)


def _on_frame(
    marks: render.Marks | None,
    frame: tuple[int, int, int, int],
    pixels: tuple[Any, ...],
    shape: tuple[int, ...],
) -> render.Marks | None:
    """``marks`` on the model's ``pixels`` (H, W) moved where those lie on the original
    image (``frame``: left, top, width, height; the picture ``shape``)."""
    if marks is None:
        return None
    left, top, width, height = frame
    sy, sx = height / pixels[0], width / pixels[1]
    boxes = tuple(
        (left + x1 * sx, top + y1 * sy, left + x2 * sx, top + y2 * sy)
        for x1, y1, x2, y2 in marks.boxes
    )
    region = None
    if marks.region is not None:
        region = _placed(marks.region.astype(np.int32), frame, shape) > 0
    segments = None
    if marks.segments is not None:  # outside the model's pixels: one segment of its own
        segments = _placed(marks.segments.astype(np.int32) + 1, frame, shape).astype(np.int64)
    return render.Marks(region, boxes, segments)


def _placed(
    labels: np.ndarray, frame: tuple[int, int, int, int], shape: tuple[int, ...]
) -> np.ndarray:
    """A map of the model's pixels (int32) stretched onto the picture's ``shape`` where
    ``frame`` (left, top, width, height) says they lie; 0 elsewhere."""
    left, top, width, height = frame
    out = np.zeros(shape[-2:], dtype=np.int32)
    stretched = Image.fromarray(labels).resize((width, height), Image.Resampling.NEAREST)
    inside = out[top : top + height, left : left + width]
    inside[...] = np.asarray(stretched)[: inside.shape[0], : inside.shape[1]]
    return out


def on_original(
    model: ModelSpec, data: bytes, attr: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int, int]] | None:
    """An image sent encoded: the attribution map (channels summed) placed where the model's
    ``pixel_values`` lie on the original image, that image ([3, H, W] in 0..1), scaled
    down only where it would not fit a picture, and where the map lies on it (left, top,
    width, height); None where the map is not at the ``pixel_values``' size (a layer's own
    map: drawn as it is)."""
    if model.images is None or attr.shape[-2:] != tuple(model.inputs[0].shape[-2:]):
        return None
    heat = attr.sum(axis=0) if attr.ndim == 3 else attr
    original = hf_image.decode(data).convert("RGB")
    left, top, right, bottom = hf_image.images(model.images).box(*original.size)
    fit = min(1.0, MAX_ORIGINAL / max(original.size))
    if fit < 1.0:
        original = original.resize(
            (max(1, round(original.width * fit)), max(1, round(original.height * fit))),
            Image.Resampling.BILINEAR,
        )
    box = [round(edge * fit) for edge in (left, top, right, bottom)]
    width, height = max(1, box[2] - box[0]), max(1, box[3] - box[1])
    placed = np.zeros((original.height, original.width))
    stretched = Image.fromarray(heat.astype(np.float32), mode="F").resize(
        (width, height), Image.Resampling.BILINEAR
    )
    region = placed[box[1] : box[1] + height, box[0] : box[0] + width]
    region[...] = np.asarray(stretched, dtype=np.float64)[: region.shape[0], : region.shape[1]]
    frame = (box[0], box[1], width, height)
    return placed, np.asarray(original, dtype=np.float64).transpose(2, 0, 1) / 255.0, frame


def _named(model: ModelSpec, target: Any) -> str:
    """The target as a title says it: its label's name where the model has labels."""
    labels = model.output.labels
    if isinstance(target, dict) and "label" in target:  # a detection's box
        return f"{_named(model, target['label'])} box"
    whole = isinstance(target, int) and not isinstance(target, bool)
    if labels and whole and -len(labels) <= target < len(labels):
        return f"{labels[target]} (class {target % len(labels)})"
    return f"target {target}"


def _layer_of(reply: Reply, part: int) -> str:
    """The layer whose attributions are ``reply.attributions[part]`` (a list of layers)."""
    names = reply.params.get("layer") or []
    at = 0
    for i, count in enumerate(reply.layers or []):
        at += count
        if part < at:
            return str(names[i]) if i < len(names) else str(i)
    return str(part)
