"""A generated answer's attributions in a precision (CONTRACT 8.1, for generative models).

``attribute_generation(..., precision=...)`` runs the language model's cast copy
(``methods.engine.precision.twin``): its forwards, and its backwards for the gradient methods,
in ``bfloat16`` or ``float16``; the scores are taken from float32 logits (``targets.wide``)
and a gradient method's path lives in float32 at the embedding (the layer taps' boundary). What
the precision cost is measured as for ``methods.attribute``: ``verify`` re-computes in float32
and answers with it where the worst relative L2 is over the tolerance (``fidelity.fallback``),
and ``auto`` probes every precision on a model's first call of a method. The attributions
compared are the returned ones, ``seq_attr``: one example, the prompt's features.

Every precision explains the same answer: one the model generates (``target=None``) is
generated once, by the model as given, and a stochastic method draws the same samples in each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import torch

from methods import registry
from methods.api import in_precision
from methods.engine import precision as precision_
from methods.engine.precision import Fidelity
from methods.errors import InvalidArgumentError, InvalidTypeError

#: runs the attribution on a model (the caller's, or its cast copy): a ``GenerationResult``
Run = Callable[[Any], Any]


def check_verify(precision: str | None, verify: object) -> None:
    """``verify`` compares a precision's answer with float32's: it needs a precision."""
    if not isinstance(verify, bool):
        raise InvalidTypeError(f"verify must be a bool, got {verify!r}", argument="verify")
    if verify and precision is None:
        raise InvalidArgumentError(
            "verify compares the answer in a precision with float32's; give precision "
            '(e.g. "bfloat16", or "float32" to check a model stored in a low dtype)',
            argument="verify",
        )


def needs_runs(model: Any, precision: str | None, verify: bool) -> bool:
    """Whether ``precision`` asks for more than one plain run on the model as given."""
    if precision is None:
        return False
    own = precision_.model_dtype(model)
    return precision == "auto" or precision_.DTYPES[precision] != own or verify


def same_samples(method: str, seed: int | None) -> int | None:
    """The seed every precision's run of a stochastic method uses (one drawn if none given)."""
    if seed is None and registry.get(method).stochastic:
        return int(torch.randint(0, 2**31 - 1, ()))
    return seed


def run_at(
    model: Any,
    method: str,
    precision: str | None,
    verify: bool,
    tolerance: float,
    run: Run,
) -> Any:
    """``run`` in ``precision`` (None: the model's own dtype, nothing to check), the result
    saying what it cost (``fidelity``)."""
    own = precision_.model_dtype(model)
    if precision is None:  # the model as given, Captum's way
        return dataclasses.replace(run(model), fidelity=precision_.Fidelity.of(own))

    def run_in(name: str) -> Any:
        """In ``name``: the model's copy in it (or the model, in its own dtype), the layer
        taps converting to float32 where it is a low dtype (a model stored in bfloat16 too)."""
        dtype = precision_.DTYPES[name]
        m = model if dtype == own else precision_.twin(model, dtype)
        with precision_.boundary(dtype) if dtype in precision_.LOW_DTYPES else nullcontext():
            return run(m)

    if not needs_runs(model, precision, verify):  # the model's own dtype, nothing to check
        return dataclasses.replace(run_in(precision), fidelity=precision_.Fidelity.of(own))
    key = ("generation", method)
    prec = str(precision)
    return in_precision(model, key, _device(model), prec, run_in, verify, tolerance)


def _device(model: Any) -> torch.device:
    if isinstance(model, torch.nn.Module):
        for p in model.parameters():
            return torch.device(p.device)
    return torch.device("cpu")


def for_stream(model: Any, method: str, precision: Any) -> tuple[Any, torch.dtype | None, Fidelity]:
    """What a stream runs on (the model, or its copy in ``precision``), the low dtype its layer
    taps convert at (None: none), and what its result says of the precision. A stream is not
    checked against float32 (its rows are sent as soon as they are known), and its generated
    answer is the running copy's: ``auto`` takes the precision the model's probe of the method
    kept (an ``attribute_generation(precision="auto")`` call, or the service's probe at load),
    else the model's own."""
    prec = precision_.check_precision(precision)
    own = precision_.model_dtype(model)
    chosen = None
    if prec == "auto":
        known = precision_.known_probe(model, ("generation", method))
        prec = None if known is None else known.precision
        chosen = "no probe of this method yet: the model's own" if known is None else known.reason()
    if prec is None:
        return model, None, dataclasses.replace(precision_.Fidelity.of(own), chosen=chosen)
    dtype = precision_.DTYPES[prec]
    low = dtype if dtype in precision_.LOW_DTYPES else None
    run_on = model if dtype == own else precision_.twin(model, dtype)
    return run_on, low, precision_.Fidelity(prec, chosen=chosen)


def in_dtype(items: Iterator[Any], low: torch.dtype | None, fidelity: Fidelity) -> Iterator[Any]:
    """``items`` (a stream's steps, then its result) computed with the layer taps converting at
    ``low``, the result saying ``fidelity``; the boundary holds only while a step computes."""
    try:
        while True:
            with precision_.boundary(low) if low is not None else nullcontext():
                try:
                    item = next(items)
                except StopIteration:
                    return
            if hasattr(item, "seq_attr"):  # the result
                item = dataclasses.replace(item, fidelity=fidelity)
            yield item
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()
