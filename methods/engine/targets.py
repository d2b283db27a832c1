"""Targets: which scalar of the model output each example is attributed to (Captum's forms)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from methods.errors import TargetError

TargetForm = Literal["none", "index", "per_example", "per_example_tuple", "top_k", "region"]


@dataclass(frozen=True, slots=True)
class Target:
    """A normalised target for a batch of ``rows`` forward rows.

    - ``none``: the output already holds one scalar per example.
    - ``index``: the same index tuple for every example (``out[:, *index]``).
    - ``per_example``: one class index per row (2-D outputs), a LongTensor of shape (rows,).
    - ``per_example_tuple``: one index tuple per row, a LongTensor of shape (rows, k).
    - ``top_k``: each example's ``index[0]`` highest-scoring classes, best first (resolved to
      ``per_example`` targets by ``methods.attribute`` before any method sees it).
    - ``region``: a class's scores summed over a region of a dense output (segmentation,
      Captum's ``agg_segmentation_wrapper``): ``rows`` one class per row, ``weights`` (rows,
      *spatial) each row's region (0/1, or any weights), ``out[r, rows[r]] * weights[r]``
      summed. ``index`` ("predicted": the pixels whose argmax is the class; "mask": one
      mask to tile per example) says it is not fixed yet: ``methods.attribute`` fixes it from
      the unperturbed output before any method sees it (``predicted_regions``).
    """

    form: TargetForm
    index: tuple[Any, ...] = ()
    rows: Tensor | None = None
    weights: Tensor | None = None

    def expand(self, n: int, *, interleave: bool = False) -> Target:
        if n == 1 or self.rows is None:
            return self
        weights = None if self.weights is None else _tiled(self.weights, n, interleave)
        return Target(self.form, self.index, _tiled(self.rows, n, interleave), weights)

    def take(self, index: Tensor | slice) -> Target:
        """The target of some rows (per-row targets indexed, the rest as it is)."""
        if self.rows is None:
            return self
        rows = self.rows[index if isinstance(index, slice) else index.to(self.rows.device)]
        weights = None
        if self.weights is not None:
            weights = self.weights[
                index if isinstance(index, slice) else index.to(self.weights.device)
            ]
        return Target(self.form, self.index, rows, weights)

    def to(self, device: torch.device) -> Target:
        if self.rows is None or self.rows.device == device:
            return self
        weights = None if self.weights is None else self.weights.to(device)
        return Target(self.form, self.index, self.rows.to(device), weights)

    def select_rows(self, out: Tensor) -> Tensor:
        """The targeted part of ``out``: (rows, ...) with the target's dims removed."""
        if self.form == "none":
            return out
        if self.form == "top_k":
            raise TargetError(
                "a top_k target is resolved to classes by methods.attribute; here give the "
                "classes (one per example)",
                argument="target",
            )
        if out.dim() == 0:
            raise TargetError(
                "the model returned a 0-d output; a target needs an output whose dim 0 "
                "indexes the examples",
                argument="target",
            )
        if self.form == "region":
            return self._region(out)
        if self.form == "index":
            if len(self.index) > out.dim() - 1:
                raise TargetError(
                    f"target {self.index} has {len(self.index)} indices but each example's "
                    f"output (shape {tuple(out.shape[1:])}) has only {out.dim() - 1} dims",
                    argument="target",
                )
            for d, i in enumerate(self.index):
                size = out.shape[d + 1]
                if isinstance(i, int) and not -size <= i < size:
                    raise TargetError(
                        f"target index {i} is out of range for output dim {d + 1} of size "
                        f"{size} (each example's output has shape {tuple(out.shape[1:])})",
                        argument="target",
                    )
            if len(self.index) == 1 and isinstance(self.index[0], int):
                return out.select(1, self.index[0])  # the common case, without Python indexing
            return out[(slice(None), *self.index)]
        return out[self._row_index(out)]

    def _region(self, out: Tensor) -> Tensor:
        """Each row's class summed over its region: (rows,)."""
        weights = self.weights
        if weights is None:
            raise TypeError("a region target carries its weights")
        if out.dim() != weights.dim() + 1 or out.shape[2:] != weights.shape[1:]:
            raise TargetError(
                f"a region of shape {tuple(weights.shape[1:])} needs an output of shape (N, "
                f"classes, {', '.join(map(str, weights.shape[1:]))}); the model returned "
                f"{tuple(out.shape)}",
                argument="target",
            )
        at, classes = self._row_index(out[(slice(None), slice(None)) + (0,) * (out.dim() - 2)])
        scores = out[at, classes]
        return (scores * weights.to(device=out.device, dtype=scores.dtype)).flatten(1).sum(1)

    def _row_index(self, out: Tensor) -> tuple[Tensor, ...]:
        """Advanced index of each row's target in ``out`` (per-example kinds), checked."""
        rows = self._rows()
        if rows.shape[0] != out.shape[0]:
            raise TargetError(
                f"target has {rows.shape[0]} entries but the model output has {out.shape[0]} "
                "rows; give one target per example",
                argument="target",
            )
        idx = rows.to(out.device)
        if idx.dim() == 1:
            idx = idx.unsqueeze(1)
        k = idx.shape[1]
        if k > out.dim() - 1:
            raise TargetError(
                f"per-example targets index {k} dims but each example's output (shape "
                f"{tuple(out.shape[1:])}) has only {out.dim() - 1} dims",
                argument="target",
            )
        sizes = torch.tensor(out.shape[1 : 1 + k], device=idx.device)
        bad = (idx < -sizes) | (idx >= sizes)
        if bool(bad.any()):
            r, d = (int(v) for v in bad.nonzero()[0])
            raise TargetError(
                f"target {int(idx[r, d])} for example {r} is out of range for output dim "
                f"{d + 1} of size {int(sizes[d])} (each example's output has shape "
                f"{tuple(out.shape[1:])})",
                argument="target",
            )
        idx = torch.where(idx < 0, idx + sizes, idx)
        return (torch.arange(out.shape[0], device=out.device), *idx.unbind(1))

    def select(self, out: Tensor) -> Tensor:
        """One scalar per row, shape (rows,): what gradient methods differentiate."""
        if self.form == "index" and len(self.index) == 1 and out.dim() == 2:
            i = self.index[0]  # the common case (one class of an (N, C) output), checked here
            if isinstance(i, int) and -out.shape[1] <= i < out.shape[1]:
                return out.select(1, i)
        sel = self.select_rows(out)
        if sel.dim() == 0:
            raise TargetError(
                "the model returned a 0-d output; gradient methods need one scalar per "
                "example (an output of shape (N,) or (N, 1))",
                argument="target",
            )
        if sel.dim() == 1:
            return sel
        if sel.numel() != sel.shape[0]:
            hint = (
                "pass a target (an int, one per example, or an index tuple)"
                if self.form == "none"
                else "the target must select exactly one element per example"
            )
            raise TargetError(
                f"the model output {tuple(out.shape)} gives {sel[0].numel()} values per example "
                f"for target {self.describe()}; {hint}",
                argument="target",
            )
        return sel.reshape(sel.shape[0])

    def describe(self) -> Any:
        if self.form == "none":
            return None
        if self.form == "index":
            return self.index[0] if len(self.index) == 1 else list(self.index)
        return self._rows().tolist()

    def _rows(self) -> Tensor:
        if self.rows is None:
            raise TypeError(f"a {self.form!r} target carries no rows")
        return self.rows


NONE = Target("none")


def _on(index: Tensor | slice, t: Tensor) -> Tensor | slice:
    return index if isinstance(index, slice) else index.to(t.device)


def _tiled(t: Tensor, n: int, interleave: bool) -> Tensor:
    if interleave:
        return t.repeat_interleave(n, dim=0)
    return t.repeat((n,) + (1,) * (t.dim() - 1))


def region(classes: Tensor, weights: Tensor) -> Target:
    """A ``region`` target: ``classes`` (N,) summed over ``weights`` (N, *spatial)."""
    return Target("region", rows=classes.long(), weights=weights)


def _index_entry(v: object, where: str) -> int | slice:
    if isinstance(v, bool):
        raise TargetError(f"{where} must be an int, got bool", argument="target")
    if isinstance(v, int):
        return v
    if isinstance(v, slice):
        return v
    if isinstance(v, Tensor) and v.numel() == 1 and not v.is_floating_point():
        return int(v.item())
    raise TargetError(f"{where} must be an int, got {type(v).__name__}", argument="target")


def make_target(target: object, n_examples: int) -> Target:
    """Normalise any of Captum's target forms for a batch of ``n_examples``.

    A negative index counts from the end of its dim, as Python and Captum index (``-1``: the
    last class); only the HTTP API refuses one (CONTRACT 9.1, ``service.wire.targets``)."""
    if target is None:
        return NONE
    if isinstance(target, Target):
        return target
    if isinstance(target, Mapping) and "class" in target:
        return _region_target(target, n_examples)
    if isinstance(target, Mapping):
        k = target.get("top_k")
        if set(target) != {"top_k"} or isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise TargetError(
                f"a dict target is {{'top_k': K}} with K a positive int, got {target!r}",
                argument="target",
            )
        return Target("top_k", (k,))
    if isinstance(target, Tensor):
        if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
            raise TargetError(
                f"a target tensor must hold integers, got dtype {target.dtype}", argument="target"
            )
        if target.numel() == 1:
            return Target("index", (int(target.item()),))
        if target.dim() == 1:
            target = target.tolist()
        elif target.dim() == 2:
            target = [tuple(r) for r in target.tolist()]
        else:
            raise TargetError(
                f"a target tensor must be 0-d, (N,) or (N, k), got shape {tuple(target.shape)}",
                argument="target",
            )
    if isinstance(target, (int, slice)) and not isinstance(target, bool):
        return Target("index", (target,))
    if isinstance(target, tuple):
        if not target:
            raise TargetError("an empty tuple is not a target", argument="target")
        return Target(
            "index", tuple(_index_entry(v, "each entry of a tuple target") for v in target)
        )
    if isinstance(target, list):
        if len(target) != n_examples:
            raise TargetError(
                f"a list target needs one entry per example: got {len(target)} entries for "
                f"{n_examples} examples",
                argument="target",
            )
        if all(isinstance(t, int) and not isinstance(t, bool) for t in target):
            return Target("per_example", rows=torch.tensor(target, dtype=torch.long))
        if all(isinstance(t, (tuple, list)) for t in target):
            lengths = {len(t) for t in target}
            if len(lengths) != 1 or 0 in lengths:
                raise TargetError(
                    "per-example tuple targets must all have the same non-zero length",
                    argument="target",
                )
            rows = [[_index_entry(v, "per-example target entries") for v in t] for t in target]
            if any(isinstance(v, slice) for r in rows for v in r):
                raise TargetError("per-example targets cannot hold slices", argument="target")
            return Target("per_example_tuple", rows=torch.tensor(rows, dtype=torch.long))
        raise TargetError(
            "a list target must hold ints (one class per example) or tuples (one index per "
            "example), not a mix",
            argument="target",
        )
    raise TargetError(
        "target must be None, an int, a tuple of ints, a list (one per example) or an integer "
        f"tensor, got {type(target).__name__}",
        argument="target",
    )


def _region_target(target: Mapping[str, Any], n: int) -> Target:
    """``{"class": c, "region": mask | "predicted"}``: ``c`` an int or one per example, the
    mask (H, W) for every example or (N, H, W); "predicted" is fixed by ``methods.attribute``
    from the unperturbed output (``index`` holds it until then)."""
    if set(target) != {"class", "region"}:
        raise TargetError(
            f"a region target is {{'class': c, 'region': mask or 'predicted'}}, got keys "
            f"{sorted(target)}",
            argument="target",
        )
    c, where = target["class"], target["region"]
    if isinstance(c, Tensor):
        c = c.tolist()
    if isinstance(c, int) and not isinstance(c, bool):
        classes = torch.full((n,), c, dtype=torch.long)
    elif (
        isinstance(c, list)
        and len(c) == n
        and all(isinstance(v, int) and not isinstance(v, bool) for v in c)
    ):
        classes = torch.tensor(c, dtype=torch.long)
    else:
        raise TargetError(
            f"a region target's class is an int or one int per example ({n}), got {c!r}",
            argument="target",
        )
    if isinstance(where, str):
        if where != "predicted":
            raise TargetError(
                f"a region is a mask tensor or 'predicted', got {where!r}", argument="target"
            )
        return Target("region", ("predicted",), classes)
    if not isinstance(where, Tensor) or where.dim() < 1 or where.is_complex():
        raise TargetError(
            "a region is a tensor of the output's spatial shape (one for every example, or "
            f"one per example), got {type(where).__name__}",
            argument="target",
        )
    return Target("region", ("mask",), classes, where)


def predicted_regions(target: Target, out: Tensor) -> Target:
    """A region target with its region fixed: the given mask tiled per example, or "predicted":
    each example's pixels whose argmax over the classes (dim 1) is its class, in ``out``, the
    unperturbed output (as Captum's segmentation tutorial fixes them)."""
    if target.form != "region":
        return target
    if out.dim() < 3:
        raise TargetError(
            f"a region target needs a dense output (N, classes, H, W, ...); the model returned "
            f"{tuple(out.shape)}",
            argument="target",
        )
    classes = target._rows().to(out.device)
    n, spatial = out.shape[0], out.shape[2:]
    if target.weights is None:
        weights = (out.argmax(dim=1) == classes.view(-1, *([1] * len(spatial)))).to(out.dtype)
    else:
        weights = target.weights.to(out.device)
        if weights.dim() == len(spatial):
            weights = weights.unsqueeze(0).expand(n, *weights.shape)
        if weights.shape != (n, *spatial):
            raise TargetError(
                f"a region must have the output's spatial shape {tuple(spatial)} (or one per "
                f"example: {(n, *tuple(spatial))}), got {tuple(target.weights.shape)}",
                argument="target",
            )
        weights = weights.to(out.dtype if out.is_floating_point() else torch.float32)
    return Target("region", (), classes, weights.contiguous())
