"""Baselines (the reference inputs), with Captum's forms: None, a number, a tensor, a tuple."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from methods.engine.inputs import Tensors
from methods.errors import BaselineError, InvalidTypeError


def _per_input(baselines: object, xs: Tensors) -> tuple[Any, ...]:
    if baselines is None:
        return (None,) * len(xs)
    if isinstance(baselines, (tuple, list)):
        if len(baselines) != len(xs):
            raise BaselineError(
                f"baselines has {len(baselines)} entries but there are {len(xs)} inputs; give "
                "one baseline per input",
                argument="baselines",
            )
        return tuple(baselines)
    if isinstance(baselines, Tensor) and len(xs) != 1:
        raise BaselineError(
            f"the model takes {len(xs)} inputs: give baselines as a tuple of {len(xs)} entries "
            "(numbers or tensors)",
            argument="baselines",
        )
    return (baselines,) * len(xs)


def format_baselines(baselines: object, xs: Tensors) -> Tensors:
    """One baseline tensor per input, each of the input's exact shape and device, and its
    dtype, except that a float baseline of an integer (or bool) input keeps a float dtype (the
    type promotion of ``x + b``): the perturbed input then takes the baseline's value, as in
    Captum 0.9, rather than its truncation.

    A number fills the input's shape; a tensor is broadcast against the input (so the
    input's shape, a single example with dim 0 of 1, or one example without the batch dim).
    """
    out = []
    for i, (b, x) in enumerate(zip(_per_input(baselines, xs), xs, strict=True)):
        if b is None:
            out.append(torch.zeros_like(x))
        elif isinstance(b, (bool, int, float)):
            out.append(torch.full_like(x, b, dtype=_dtype(x, torch.result_type(x, b))))
        elif isinstance(b, Tensor):
            if b.is_complex() and not x.is_complex():
                raise InvalidTypeError(
                    f"baselines[{i}] is complex but inputs[{i}] is not", argument="baselines"
                )
            try:
                dtype = _dtype(x, torch.promote_types(x.dtype, b.dtype))
                bb = torch.broadcast_to(b.to(device=x.device, dtype=dtype), x.shape)
            except RuntimeError:
                raise BaselineError(
                    f"baselines[{i}] has shape {tuple(b.shape)}, which does not broadcast to "
                    f"inputs[{i}] of shape {tuple(x.shape)}; expected the input's shape, "
                    f"(1, *{tuple(x.shape[1:])}) or a number",
                    argument="baselines",
                ) from None
            out.append(bb)
        else:
            raise InvalidTypeError(
                f"baselines[{i}] must be None, a number or a Tensor, got {type(b).__name__}",
                argument="baselines",
            )
    return tuple(out)


def _dtype(x: Tensor, promoted: torch.dtype) -> torch.dtype:
    """The baseline's dtype: the input's, or the promoted float one for an integer input."""
    integral = not (x.is_floating_point() or x.is_complex())
    return promoted if integral and promoted.is_floating_point else x.dtype


def format_baseline_distribution(baselines: object, xs: Tensors, method: str) -> Tensors:
    """Baselines for the SHAP family: per input a tensor of B >= 1 reference rows.

    A callable is called with no arguments, or with ``inputs`` if it takes one parameter.
    """
    if callable(baselines) and not isinstance(baselines, Tensor):
        baselines = _call_baseline_fn(baselines, xs)
    if baselines is None:
        raise BaselineError(
            f"{method} needs baselines: a tensor of reference rows per input (or a callable "
            "returning them)",
            argument="baselines",
        )
    out = []
    for i, (b, x) in enumerate(zip(_per_input(baselines, xs), xs, strict=True)):
        if isinstance(b, (int, float)) and not isinstance(b, bool):
            b = torch.full((1, *x.shape[1:]), float(b), dtype=x.dtype, device=x.device)
        out.append(reference_rows(b, x, f"baselines[{i}]", method).to(x.device, x.dtype))
    rows = {b.shape[0] for b in out}
    if len(rows) == 2 and 1 in rows:
        # a number (or a single row) is the same reference whichever row is drawn
        (many,) = rows - {1}
        out = [b.expand(many, *b.shape[1:]) if b.shape[0] == 1 else b for b in out]
        rows = {many}
    if len(rows) != 1:
        raise BaselineError(
            f"every input's baselines must have the same number of rows, got {sorted(rows)}",
            argument="baselines",
        )
    return tuple(out)


def reference_rows(b: object, x: Tensor, where: str, who: str) -> Tensor:
    """``b`` as reference rows of the input ``x``, ``(B, *x.shape[1:])`` with B >= 1 (one
    example without its batch dim is one row); ``where`` and ``who`` name them in errors."""
    if not isinstance(b, Tensor):
        raise InvalidTypeError(
            f"{where} for {who} must be a Tensor of reference rows, got {type(b).__name__}",
            argument="baselines",
        )
    if b.dim() == x.dim() - 1:
        b = b.unsqueeze(0)
    if b.dim() != x.dim() or tuple(b.shape[1:]) != tuple(x.shape[1:]) or b.shape[0] < 1:
        raise BaselineError(
            f"{where} has shape {tuple(b.shape)}; {who} expects reference rows of shape "
            f"(B, *{tuple(x.shape[1:])}) with B >= 1",
            argument="baselines",
        )
    return b


def _call_baseline_fn(fn: Callable[..., Any], xs: Tensors) -> Any:
    import inspect

    try:
        n_params = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        n_params = 0
    arg = xs if len(xs) > 1 else xs[0]
    return fn(arg) if n_params >= 1 else fn()
