"""Deletion and insertion curves (Petsiuk et al. 2018, RISE): ours; see ``methods.evaluation``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import Tensor

from methods.engine.batching import run_chunks
from methods.engine.inputs import Forward, Tensors
from methods.engine.targets import Target
from methods.errors import BaselineError, InvalidArgumentError

__all__ = ["baselines_for", "curve", "feature_ids"]


def baselines_for(baselines: Any, xs: Tensors) -> Tensors:
    """One baseline per input, broadcast (a view) to the input's shape."""
    if baselines is None:
        given: tuple[Any, ...] = (0,) * len(xs)
    elif isinstance(baselines, (tuple, list)):
        given = tuple(baselines)
    elif isinstance(baselines, Tensor) and len(xs) > 1:
        raise BaselineError(
            "with several inputs, baselines must be a number or a tuple (one per input)",
            argument="baselines",
        )
    else:
        given = (baselines,) * len(xs)
    if len(given) != len(xs):
        raise BaselineError(
            f"baselines has {len(given)} entries for {len(xs)} inputs", argument="baselines"
        )
    out = []
    for i, (b, x) in enumerate(zip(given, xs, strict=True)):
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            t = torch.tensor(b, dtype=x.dtype, device=x.device)
        elif isinstance(b, Tensor):
            t = b.detach().to(dtype=x.dtype, device=x.device)
        else:
            raise BaselineError(
                f"baselines[{i}] must be a number or a Tensor, got {type(b).__name__}",
                argument="baselines",
            )
        try:
            out.append(torch.broadcast_to(t, x.shape))
        except RuntimeError:
            raise BaselineError(
                f"baselines[{i}] of shape {tuple(t.shape)} does not broadcast to the input's "
                f"shape {tuple(x.shape)}",
                argument="baselines",
            ) from None
    return tuple(out)


def feature_ids(feature_mask: Any, xs: Tensors) -> Tensors:
    """Each element's feature id, per input (N, elements): shared ids mean one feature."""
    n = int(xs[0].shape[0])
    if feature_mask is None:
        out, offset = [], 0
        for x in xs:
            if x.dim() == 4:  # an image: a feature is a pixel position, over all channels
                _, _, h, w = x.shape
                ids = torch.arange(h * w, device=x.device).reshape(1, 1, h, w)
                count = h * w
            else:
                count = math.prod(x.shape[1:])
                ids = torch.arange(count, device=x.device).reshape(1, *x.shape[1:])
            out.append((ids + offset).expand(x.shape).reshape(n, -1))
            offset += count
        return tuple(out)
    masks = feature_mask if isinstance(feature_mask, (tuple, list)) else (feature_mask,)
    if len(masks) != len(xs) or not all(isinstance(m, Tensor) for m in masks):
        raise InvalidArgumentError(
            f"feature_mask must be a Tensor per input ({len(xs)}), got {len(masks)} "
            f"({', '.join(type(m).__name__ for m in masks)})",
            argument="feature_mask",
        )
    out = []
    for i, (m, x) in enumerate(zip(masks, xs, strict=True)):
        if m.is_floating_point() or m.is_complex() or m.dtype == torch.bool:
            raise InvalidArgumentError(
                f"feature_mask[{i}] must hold integer feature ids, got dtype {m.dtype}",
                argument="feature_mask",
            )
        if m.dim() == x.dim() and m.shape[0] not in (1, n):
            m = m.new_empty(0)  # dim 0 must be 1 or the number of examples: fail below
        try:
            out.append(torch.broadcast_to(m.to(x.device), x.shape).reshape(n, -1).long())
        except RuntimeError:
            raise InvalidArgumentError(
                f"feature_mask[{i}] of shape {tuple(masks[i].shape)} does not broadcast to the "
                f"input's shape {tuple(x.shape)} (its dim 0 must be 1 or {n})",
                argument="feature_mask",
            ) from None
    return tuple(out)


def _ranks(ids: Tensors, attrs: Tensors) -> tuple[Tensor, Tensor]:
    """Each element's feature's rank (0 = most important), (N, D), and features per example."""
    device = ids[0].device
    flat_ids = torch.cat([i.to(device) for i in ids], dim=1)
    n = flat_ids.shape[0]
    flat_attr = torch.cat([a.reshape(n, -1).to(device) for a in attrs], dim=1)
    if not flat_attr.is_floating_point():
        flat_attr = flat_attr.double()
    _, inv = torch.unique(flat_ids, return_inverse=True)  # ids -> 0..F-1, in id order
    n_feat = int(inv.max()) + 1 if inv.numel() else 0
    scores = flat_attr.new_zeros(n, n_feat).scatter_add_(1, inv, flat_attr)
    present = torch.zeros(n, n_feat, dtype=torch.bool, device=device)
    present.scatter_(1, inv, True)
    scores = torch.where(present, scores, torch.full_like(scores, -math.inf))  # absent: last
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(n_feat, device=device).expand(n, n_feat).contiguous()
    )
    return rank.gather(1, inv), present.sum(1)


def curve(
    forward: Forward,
    xs: Tensors,
    attrs: Tensors,
    ids: Tensors,
    bases: Tensors,
    tgt: Target,
    insertion: bool,
    p: dict[str, Any],
) -> Tensor:
    """The targeted output at every step, (N, steps + 1), over batched forwards of rows."""
    steps = int(p["steps"])
    n = int(xs[0].shape[0])
    rank, n_feat = _ranks(ids, attrs)
    s = torch.arange(steps + 1, device=rank.device)
    # features replaced at step s: ceil(s * F / steps), in integers
    k = (s[None, :] * n_feat[:, None] + steps - 1) // steps
    widths = [i.shape[1] for i in ids]
    parts = torch.split(rank, widths, dim=1)

    def rows(lo: int, hi: int) -> Tensor:
        r = torch.arange(lo, hi, device=rank.device)
        ex, st = r // (steps + 1), r % (steps + 1)
        kk = k[ex, st][:, None]
        batch = []
        for x, b, part in zip(xs, bases, parts, strict=True):
            gone = (part[ex] < kk).reshape(hi - lo, *x.shape[1:]).to(x.device)
            e = ex.to(x.device)
            kept, filled = (x[e], b[e]) if not insertion else (b[e], x[e])
            batch.append(torch.where(gone, filled, kept))
        args = tuple(
            a[ex.to(a.device)] if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] == n else a
            for a in forward.args
        )
        row_tgt = tgt.take(ex)
        return row_tgt.select(dataclasses.replace(forward, args=args)(tuple(batch)))

    total = n * (steps + 1)
    cap = p["max_examples_per_batch"]
    with torch.no_grad():
        values, _ = run_chunks(total, cap or total, rows, retry_oom=True)
    curve = torch.cat(values).reshape(n, steps + 1)
    return curve if curve.is_floating_point() else curve.double()
