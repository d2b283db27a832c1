"""Answers for several targets or baselines in one call: a ``{"top_k": K}`` target (each
example's K best classes) and a background set (the mean answer over its rows). Each tiles the
call's batch (``Call.expanded``: copy ``k`` stacked ``k``-th, forward args and targets tiled
with it), runs the method once on the tiled call, and folds the answer back per example; the
two nest (a top_k target over a background set). ``base_values``: the targeted output at the
baselines, for a Shapley-family method that did not report its own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from methods.engine import background
from methods.engine.background import Background
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Result
from methods.engine.guard import model_guard
from methods.engine.targets import Target
from methods.errors import TargetError

#: the method on a (tiled) call
Run = Callable[[Call], Result]
#: the members of a result with one row per (tiled) example
PER_ROW = ("attributions", "convergence_delta", "base_values", "standard_error")


def _each(result: Result, fold: Callable[[Any], Any]) -> dict[str, Any]:
    return {name: fold(getattr(result, name)) for name in PER_ROW}


def over_background(call: Call, run: Run) -> Result:
    """The (weighted) mean of the answers with each background row as the baselines."""
    rows, weights = background.formatted(call.baselines, call.inputs)
    n, b = call.n, rows[0].shape[0]
    inputs, bases = background.tiled(call.inputs, rows)
    r = run(call.expanded(b).replace(inputs=inputs, baselines=bases))
    return dataclasses.replace(
        r,
        **_each(r, lambda v: background.fold(v, n, weights)),
        outputs=background.first(r.outputs, n),
        params={**r.params, "background_rows": b},
    )


def top_k(call: Call, run: Run, *, distribution: bool) -> Result:
    """Each example's K highest-scoring classes (on the attributed scale), best first, in
    one call: the batch tiled K times, copy k targeting each example's k-th class.
    ``distribution``: the baselines are rows drawn from, not one per example."""
    (k,) = call.target.index
    with torch.no_grad(), model_guard(call.model):
        out = call.forward(call.inputs)
    if out.dim() != 2:
        raise TargetError(
            f"a top_k target ranks the classes of an output of shape (N, classes); the model "
            f"returned {tuple(out.shape)}",
            argument="target",
        )
    if k > out.shape[1]:
        raise TargetError(
            f"top_k is {k} but the model has {out.shape[1]} classes", argument="target"
        )
    classes = out.topk(k, dim=1).indices  # (N, K), best first
    n = call.n
    per_example = not distribution and not isinstance(call.baselines, Background)
    r = run(
        call.expanded(k).replace(
            inputs=tuple(_tiled(x, k) for x in call.inputs),
            baselines=_tiled_baselines(call.baselines, n, k) if per_example else call.baselines,
            target=Target("per_example", rows=classes.T.reshape(-1)),
        )
    )
    unfold = _per_class(n, k)
    return dataclasses.replace(r, **_each(r, unfold), outputs=unfold(r.outputs), target=classes)


def _tiled(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.repeat((k,) + (1,) * (x.dim() - 1))


def _tiled_baselines(baselines: Any, n: int, k: int) -> Any:
    """Per-example baselines tiled with the batch; numbers and single rows stay as they are."""

    def tile(b: Any) -> Any:
        per_row = isinstance(b, torch.Tensor) and b.dim() > 0 and b.shape[0] == n and n > 1
        return _tiled(b, k) if per_row else b

    if isinstance(baselines, (tuple, list)):
        return type(baselines)(tile(b) for b in baselines)
    return tile(baselines)


def _per_class(n: int, k: int) -> Callable[[Any], Any]:
    """A K-times tiled answer (dim 0: K * n, copy k stacked k-th) as (n, K, ...)."""

    def unfold(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.dim() == 0 or value.shape[0] != k * n:
                raise TargetError(
                    f"this method's answer has shape {tuple(value.shape)}, not one row per "
                    "example, so it cannot be split per class; pass one target",
                    argument="target",
                )
            return value.reshape(k, n, *value.shape[1:]).transpose(0, 1)
        if isinstance(value, (tuple, list)):
            return type(value)(unfold(v) for v in value)
        return value

    return unfold


def base_values(call: Call) -> torch.Tensor:
    """The targeted output at each example's baselines (what a Shapley-family answer's
    attributions complete to the output)."""
    with torch.no_grad(), model_guard(call.model):
        out = call.forward(format_baselines(call.baselines, call.inputs))
    return call.target.select_rows(out).detach()  # the targeted output's shape per example
