"""Feature masks of the perturbation methods: Captum's masks checked and made compact
(``format_feature_mask``), perturbed inputs built from them (``coalition_inputs``,
``drop_one_inputs``), and per-feature values spread back onto the inputs (``spread``).
``methods.engine.perturb`` evaluates what is built here.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from methods.engine.inputs import Tensors
from methods.errors import InvalidArgumentError, InvalidTypeError

#: entries kept per cache below (input signatures seen); the oldest goes first
CACHE_SIZE = 256


@dataclass(frozen=True)
class FeatureMasks:
    """Feature masks with ids made compact: ``index[i]`` maps each element of input ``i`` to a
    feature 0..F-1; shape (m, *inputs[i].shape[1:]) with m = 1 (shared) or N (per example).

    The tensors may be shared between calls (see ``format_feature_mask``): never modify them.
    """

    index: Tensors
    #: the caller's feature id for each compact index, ascending
    ids: Tensor
    #: for the default mask (each scalar its own feature, in order): input i's first feature
    starts: tuple[int, ...] | None = None

    @property
    def n_features(self) -> int:
        return int(self.ids.numel())

    @property
    def rows(self) -> int:
        return max(int(i.shape[0]) for i in self.index)


def format_feature_mask(feature_mask: object, xs: Tensors, method: str) -> FeatureMasks:
    """Captum's feature masks: None (each scalar its own feature, ids running across inputs), or
    one integer tensor per input broadcastable to it, with dim 0 of 1 or N. An id used in several
    inputs is one feature, perturbed together."""
    n = int(xs[0].shape[0])
    if feature_mask is None:
        return _default_mask(tuple((tuple(x.shape[1:]), x.device) for x in xs))
    given = feature_mask if isinstance(feature_mask, (tuple, list)) else (feature_mask,)
    for i, m in enumerate(given):
        if not isinstance(m, Tensor):
            raise InvalidTypeError(
                f"{method}: feature_mask must be an integer Tensor or a tuple of them (one "
                f"per input); entry {i} is {type(m).__name__}",
                argument="feature_mask",
            )
    if len(given) != len(xs):
        raise InvalidArgumentError(
            f"{method}: feature_mask has {len(given)} entries but there are {len(xs)} "
            "inputs; give one mask per input",
            argument="feature_mask",
        )
    pairs = enumerate(zip(given, xs, strict=True))
    raw = tuple(_check_mask(m, x, i, n, method) for i, (m, x) in pairs)
    flat = torch.cat([m.reshape(-1).to(xs[0].device) for m in raw])
    ids, inverse = torch.unique(flat, sorted=True, return_inverse=True)
    index, pos = [], 0
    for m, x in zip(raw, xs, strict=True):
        part = inverse[pos : pos + m.numel()].reshape(m.shape).to(x.device)
        pos += m.numel()
        index.append(part.expand(int(m.shape[0]), *x.shape[1:]))
    return FeatureMasks(tuple(index), ids)


Signature = tuple[tuple[tuple[int, ...], torch.device], ...]

#: the default masks per input signature (per-example shapes and devices): a served model sees
#: the same shapes again and again, and building them costs more than a small model's forward
_default_masks: dict[Signature, FeatureMasks] = {}


def _default_mask(sig: Signature) -> FeatureMasks:
    found = _default_masks.get(sig)
    if found is not None:
        return found
    # Already compact: ids 0..F-1 running across the inputs.
    masks, starts, start = [], [], 0
    for shape, device in sig:
        size = math.prod(shape)
        masks.append(torch.arange(start, start + size, device=device).reshape(1, *shape))
        starts.append(start)
        start += size
    found = FeatureMasks(tuple(masks), torch.arange(start, device=sig[0][1]), tuple(starts))
    bounded_put(_default_masks, sig, found)
    return found


def bounded_put(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """``cache[key] = value``, the oldest entry dropped past ``CACHE_SIZE``."""
    if len(cache) >= CACHE_SIZE:
        cache.pop(next(iter(cache)))  # the oldest entry
    cache[key] = value


def _check_mask(m: object, x: Tensor, i: int, n: int, method: str) -> Tensor:
    where = f"feature_mask[{i}]"
    if not isinstance(m, Tensor):
        raise InvalidTypeError(f"{method}: {where} must be a Tensor", argument="feature_mask")
    if m.is_floating_point() and bool(torch.isfinite(m).all()) and bool((m == m.round()).all()):
        m = m.long()  # integral floats, as Captum takes them
    if m.is_floating_point() or m.is_complex() or m.dtype == torch.bool:
        raise InvalidTypeError(
            f"{method}: {where} must hold integer feature ids (integral floats are taken), got "
            f"dtype {m.dtype}" + (" with non-integral values" if m.is_floating_point() else ""),
            argument="feature_mask",
        )
    if m.dim() == 0:
        return m.reshape((1,) * x.dim())
    shape = (1,) * (x.dim() - m.dim()) + tuple(m.shape)
    ok = m.dim() <= x.dim() and all(
        a in (1, b) for a, b in zip(shape[1:], x.shape[1:], strict=True)
    )
    if x.shape[0] != n and (not ok or shape[0] not in (1, x.shape[0])):
        raise InvalidArgumentError(
            f"{method}: {where} has shape {tuple(m.shape)}; inputs[{i}] of shape "
            f"{tuple(x.shape)} is not per example (dim 0 is not inputs[0]'s {n}), so its mask "
            f"is broadcast to it as Captum does: expected a shape broadcastable to "
            f"{tuple(x.shape)}, or a 0-d id",
            argument="feature_mask",
        )
    if x.shape[0] != n and shape[0] > 1:
        # a mask as long as its input (broadcastable to it, as Captum takes it): such an input
        # gets one attribution as a whole, so its rows must group it alike
        m = m.reshape(shape)
        if not bool((m == m[:1]).all()):
            raise InvalidArgumentError(
                f"{method}: {where} gives the rows of inputs[{i}] (not per example: dim 0 is "
                f"not inputs[0]'s {n}) different feature ids; such an input is attributed as "
                f"a whole, so give its rows the same ids or a mask of shape "
                f"{(1, *x.shape[1:])}",
                argument="feature_mask",
            )
        return m[:1]
    if not ok or shape[0] not in (1, n):
        raise InvalidArgumentError(
            f"{method}: {where} has shape {tuple(m.shape)}, which does not fit inputs[{i}] of "
            f"shape {tuple(x.shape)}; expected (1 or {n}, *{tuple(x.shape[1:])}) or a shape "
            "broadcastable to it",
            argument="feature_mask",
        )
    return m.reshape(shape)


def coalition_inputs(masks: FeatureMasks, keep: Tensor, on: Tensors, off: Tensors) -> Tensors:
    """One batch of ``k * N`` rows, copy-major: row ``j * N + n`` is example ``n`` with every
    feature ``f`` where ``keep[j, n or 0, f]`` taken from ``on``, every other from ``off``.

    ``keep``: bool (k, 1 or N, F); ``on``/``off``: per input, (N, ...) tensors, or (k, N, ...)
    for values that differ per perturbation.
    """
    k, zr, _ = keep.shape
    out = []
    for idx, a, b in zip(masks.index, on, off, strict=True):
        m, rest = int(idx.shape[0]), tuple(idx.shape[1:])
        r = max(m, zr)
        flat = idx.reshape(m, -1)
        if zr == 1:
            sel = keep[:, 0][:, flat]  # (k, m, E): plain indexing, cheaper than gather
        else:
            sel = torch.gather(keep, 2, flat.expand(r, -1).unsqueeze(0).expand(k, r, -1))
        sel = sel.reshape(k, r, *rest)
        out.append(torch.where(sel, a, b).reshape(k * int(a.shape[-len(rest) - 1]), *rest))
    return tuple(out)


def drop_one_inputs(masks: FeatureMasks, s: int, e: int, on: Tensors, off: Tensors) -> Tensors:
    """Perturbations ``s..e-1`` of "every feature but ``j`` from ``on``, feature ``j`` from
    ``off``": ``coalition_inputs`` with ``keep = ~eye(F)[s:e]``, without the (F, F) matrix.
    Perturbation -1 takes every feature from ``on`` (no feature has id -1)."""
    out = []
    for idx, a, b in zip(masks.index, on, off, strict=True):
        # (k, m, *rest) selects into (k, N, *rest): copy-major rows
        out.append(torch.where(_keeps(idx, s, e), a, b).flatten(0, 1))
    return tuple(out)


#: drop-one masks of small feature masks, per mask tensor (by id, checked through a weakref:
#: the default masks are cached per input signature, so a served model reuses one mask)
_KEEPS: dict[int, tuple[weakref.ref[Tensor], dict[tuple[int, int], Tensor]]] = {}
_KEEPS_MAX_ELEMENTS = 1 << 16


def _keeps(idx: Tensor, s: int, e: int) -> Tensor:
    """``idx != j`` for j in s..e-1, stacked: (e - s, *idx.shape)."""
    small = idx.numel() * (e - s) <= _KEEPS_MAX_ELEMENTS
    entry = _KEEPS.get(id(idx)) if small else None
    if entry is not None and entry[0]() is idx and (s, e) in entry[1]:
        return entry[1][(s, e)]
    drop = torch.arange(s, e, device=idx.device).view(e - s, *(1,) * idx.dim())
    keep = idx != drop
    if small:
        if entry is None or entry[0]() is not idx:
            for key in [k for k, (ref, _) in _KEEPS.items() if ref() is None]:
                del _KEEPS[key]  # masks that are gone
            entry = (weakref.ref(idx), {})
            bounded_put(_KEEPS, id(idx), entry)
        if len(entry[1]) < 4:
            entry[1][(s, e)] = keep
    return keep


def spread(values: Tensor, masks: FeatureMasks, xs: Tensors, method: str) -> Tensors:
    """Per-feature values back onto input elements.

    ``values``: (F, O0, *O). Returns per input (O0, *O, *input.shape[1:]) with element ``e`` of
    output row ``o`` taking its feature's value (the mask's dim 0 pairs with O0).
    """
    f, o0 = int(values.shape[0]), int(values.shape[1])
    orest = tuple(values.shape[2:])
    v = values.reshape(f, o0, -1).permute(1, 2, 0)  # (O0, Orest, F)
    out = []
    if masks.starts is not None:
        # The default mask numbers the elements in order: input i's features are a slice.
        for start, x in zip(masks.starts, xs, strict=True):
            part = v if len(xs) == 1 else v[:, :, start : start + math.prod(x.shape[1:])]
            out.append(part.reshape(o0, *orest, *x.shape[1:]))
        return tuple(out)
    for idx, x in zip(masks.index, xs, strict=True):
        m = int(idx.shape[0])
        if m not in (1, o0):
            raise InvalidArgumentError(
                f"{method}: a per-example feature_mask (dim 0 = {m}) needs one output row per "
                f"example, but the targeted output has {o0} rows; pass a target, or a mask "
                "with dim 0 of 1",
                argument="feature_mask",
            )
        flat = idx.reshape(m, 1, -1).expand(o0, v.shape[1], -1)
        out.append(torch.gather(v, 2, flat).reshape(o0, *orest, *x.shape[1:]))
    return tuple(out)
