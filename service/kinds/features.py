"""Feature groups the server draws for a request: superpixels of images and units of texts.

Request side: a mask param given as ``{"superpixels": {...}}`` (``params.feature_mask``, XRAI's
``params.segments``) is segmented on the decoded images, the model's own ``pixel_values`` for
an encoded image (``methods.engine.superpixels``; an image sent twice is segmented once), so
the cost is counted on the real segments and the answer returns them; ``units`` other than
tokens are checked and counted on the raw texts (``methods.generation.units.text_spans``).

Worker side: a text's units become the feature mask of its tokens (each token in the unit its
first character falls in, by the tokenizer's character offsets), and the per-token answer one
value per unit. The tokens the tokenizer adds, the padding and characters outside every unit
join the first unit: their baseline is themselves, so they change nothing when it is
perturbed. A unit no token falls in (a dash a word tokenizer drops) scores 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from methods.engine import superpixels
from methods.errors import AttributionError
from methods.generation.units import TEXT_UNITS, text_spans
from methods.params import MethodParams
from methods.registry import MethodSpec
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest
from service.wire.codec import DecodedInputs
from service.wire.engine_errors import from_engine

#: the values a request's ``units`` takes
UNITS = ("token", *TEXT_UNITS)


def skip_decode(value: Any) -> bool:
    """Whether a tensor param's value is a superpixels spec (drawn here, not decoded)."""
    return superpixels.is_spec(value)


def draw_superpixels(
    spec: ModelSpec, ms: MethodSpec, p: MethodParams, inputs: DecodedInputs
) -> tuple[MethodParams, str | None]:
    """``p`` with a superpixels spec among the method's mask params made the integer mask of
    the images (the name of the param drawn, or None where none was)."""
    for name in sorted(ms.mask_params):
        value = getattr(p, name, None)
        if not superpixels.is_spec(value):
            continue
        loc = ("body", "params", name)
        if inputs.texts:
            raise InvalidRequest(
                f"superpixels segment images; model {spec.id!r} takes texts: group its tokens "
                f'with "units" ({", ".join(UNITS)})',
                loc=loc,
            )
        for i, a in enumerate(inputs.arrays):
            if a.dtype.kind != "f" or not superpixels.is_image_shape(tuple(a.shape[1:])):
                raise InvalidRequest(
                    f"superpixels segment images, [N, 1 or 3, H, W] floating inputs; input {i} "
                    f"of model {spec.id!r} is {a.dtype} {list(a.shape)}: give params.{name} as "
                    "an integer mask instead",
                    loc=loc,
                )
        try:
            parsed = superpixels.parse(value, f"{name}.superpixels")
            masks = superpixels.masks_of(list(inputs.arrays), parsed)
        except AttributionError as exc:
            raise from_engine(exc) from None
        drawn = masks[0] if len(masks) == 1 else tuple(masks)
        return p.model_copy(update={name: drawn}), name
    return p, None


def drawn_segments(work: Any) -> list[np.ndarray] | None:
    """The superpixels a request's work was given (``Attribution.drawn``): one ``[N, H, W]``
    map per image input."""
    name = getattr(work, "drawn", None)
    if name is None or name not in work.params:
        return None
    value = work.params[name]
    return [np.asarray(m)[:, 0] for m in (value if isinstance(value, tuple) else (value,))]


def check_units(
    spec: ModelSpec,
    ms: MethodSpec,
    p: MethodParams,
    units: str | None,
    inputs: DecodedInputs,
    requested: str,
) -> int | None:
    """A request's ``units`` checked against the model, the method (``requested``: as the
    request names it) and the inputs: the most units a text has (what a perturbation costs),
    or None for tokens."""
    if units in (None, "token"):
        return None
    loc = ("body", "units")
    if not spec.takes_text:
        hint = (
            ': superpixels group an image\'s pixels (params.feature_mask: {"superpixels": '
            '{"algorithm": "slic"}})'
            if inputs.arrays and superpixels.is_image_shape(tuple(inputs.arrays[0].shape[1:]))
            else ""
        )
        raise InvalidRequest(
            f"units {units!r} split texts; model {spec.id!r} takes no text{hint}", loc=loc
        )
    if not inputs.texts:
        raise InvalidRequest(
            f"units {units!r} split texts: send the texts themselves, not token ids", loc=loc
        )
    if any(not isinstance(t, str) for t in inputs.texts):
        raise InvalidRequest(f"units {units!r} split single texts, not pairs of texts", loc=loc)
    if "feature_mask" not in ms.params.model_fields:
        raise InvalidRequest(
            f"units group tokens for the perturbation methods that take params.feature_mask "
            f"(feature_ablation, shapley_value_sampling, kernel_shap, lime, ...); {requested} "
            "does not",
            loc=loc,
        )
    if getattr(p, "feature_mask", None) is not None:
        raise InvalidRequest(
            "give units or params.feature_mask, not both: units make the feature mask",
            loc=loc,
        )
    counts = []
    for i, text in enumerate(inputs.texts):
        spans = text_spans(str(text), units)
        if not spans:
            raise InvalidRequest(
                f"text {i} has no {units} to attribute to", loc=("body", "inputs", i)
            )
        counts.append(len(spans))
    return max(counts)


def unit_mask(
    tokenizer: Any, texts: tuple[Any, ...], ids: torch.Tensor, units: str
) -> tuple[torch.Tensor, list[list[dict[str, Any]]], list[list[int]]]:
    """The feature mask of ``ids`` ([N, L], the tokenizer's) grouping each text's tokens by
    its ``units``; the units (text and character offsets) and, per unit, the position of its
    first token (-1: none)."""
    offsets_of = getattr(tokenizer, "offsets", None)
    if offsets_of is None:
        raise InvalidRequest(
            "this model's tokenizer gives no character offsets, which units need; attribute "
            "its tokens (units: token)",
            loc=("body", "units"),
        )
    try:
        offsets = offsets_of(list(texts))
    except ValueError as exc:
        raise InvalidRequest(str(exc), loc=("body", "units")) from None
    mask = torch.zeros(ids.shape, dtype=torch.int64)
    out_units, firsts = [], []
    for row, (text, spans_of_tokens) in enumerate(zip(texts, offsets, strict=True)):
        spans = text_spans(str(text), units)
        starts = np.array([a for a, _ in spans])
        first = [-1] * len(spans)
        for pos, span in enumerate(spans_of_tokens[: ids.shape[1]]):
            if span is None or span[1] <= span[0]:
                continue
            u = int(np.searchsorted(starts, span[0], side="right")) - 1
            if u < 0 or span[0] >= spans[u][1]:  # between units (white space): the next one
                u = min(u + 1, len(spans) - 1)
            mask[row, pos] = u
            if first[u] < 0:
                first[u] = pos
        out_units.append([{"text": text[a:b], "start": a, "end": b} for a, b in spans])
        firsts.append(first)
    return mask.to(ids.device), out_units, firsts


def per_unit(values: np.ndarray, firsts: list[list[int]], per_feature: bool) -> np.ndarray:
    """Per-token values ``[N, L, ...]`` as one per unit ``[N, U, ...]``: each unit's value at
    its first token (every token of a unit has it), 0 where no token falls in it. Values
    already per feature (``per_feature``: a surrogate's ``return_input_shape=false``) are the
    units' (feature ids are unit indices)."""
    n, width = values.shape[0], max((len(f) for f in firsts), default=0)
    if per_feature:
        return values[:, :width]
    out = np.zeros((n, width, *values.shape[2:]), dtype=values.dtype)
    for row, first in enumerate(firsts):
        for u, pos in enumerate(first):
            if pos >= 0:
                out[row, u] = values[row, pos]
    return out
