"""Batched, forward-only evaluation of perturbed inputs (the perturbation methods' engine).

Perturbation methods describe *what* to evaluate as data: a boolean matrix saying, per
perturbation and feature, whether the feature keeps its input value
(``masks.coalition_inputs``), or a list of boxes (occlusion). This module evaluates those
perturbations as a few large forwards under ``no_grad``: ``Evaluator.run`` asks the method for
one chunk of perturbations at a time, each built as one tensor of ``k * N`` rows, and sizes
``k`` from ``perturbations_per_eval`` (an int, or ``"auto"``/``None``: as many as the memory
budget allows).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods import progress
from methods.cancel import checkpoint
from methods.engine.batching import Footprint, cache_rows, count_saved_bytes, memory_budget
from methods.engine.call import Call
from methods.engine.inputs import Tensors
from methods.engine.masks import bounded_put
from methods.errors import InvalidArgumentError, ModelError

#: For integer inputs nothing can be measured on CPU: assume a forward holds this many times
#: the input's bytes (8-byte ids to 4 x 768-byte embeddings would be 384; then a few layers).
INTEGER_INPUT_BLOWUP = 4096

Build = Callable[[int, int], Tensors]
Inspect = Callable[[int, int, Tensors], None]


@dataclass
class Evaluator:
    """Runs chunks of perturbations through the model; see ``start``."""

    call: Call
    #: shape of the targeted output for one unperturbed batch (a 0-d output counts as (1,))
    out_shape: tuple[int, ...]
    #: whether dim 0 of the output grows with the batch; if not, one perturbation per forward
    per_example: bool
    #: estimated bytes one perturbation (N rows) holds during its forward
    perturbation_bytes: int
    #: on CPU, what one perturbation's largest layer works on, where known to be less than
    #: ``perturbation_bytes`` (see ``batching.CPU_CHUNK_BYTES``); 0: ``perturbation_bytes``
    working_bytes: int = 0
    used: int = 0
    _subcalls: dict[int, Call] = field(default_factory=dict)

    def forward(self, inputs: Tensors, k: int) -> Tensor:
        """Targeted output of ``k`` stacked copies of the batch, shape (k, *out_shape)."""
        sub = self._subcalls.get(k)
        if sub is None:
            sub = self._subcalls[k] = self.call.expanded(k)
        with torch.no_grad():
            out = sub.target.select_rows(sub.forward(inputs))
        out = out.reshape(1) if out.dim() == 0 else out
        expected = (k * self.out_shape[0], *self.out_shape[1:])
        if tuple(out.shape) != expected:
            raise _ShapeMismatch(tuple(out.shape), expected)
        return out.reshape(k, *self.out_shape)

    def per_chunk(self, total: int) -> int:
        if not self.per_example:
            return 1
        return _per_chunk(self.call, self.perturbation_bytes, total, self.working_bytes)

    def run(self, total: int, build: Build, inspect: Inspect | None = None) -> Tensor:
        """Evaluate perturbations 0..total-1; ``build(s, e)`` returns their ``(e-s)*N`` rows."""
        parts: list[Tensor] = []
        per = self.per_chunk(total)
        auto = not isinstance(self.call.perturbations_per_eval, int)
        s = 0
        progress.expect(total)
        while s < total:
            checkpoint()
            e = min(total, s + per)
            inputs = build(s, e)
            try:
                parts.append(self.forward(inputs, e - s))
            except torch.OutOfMemoryError:
                if not auto or per == 1:
                    raise
                per = max(1, per // 2)
                continue
            except _ShapeMismatch as exc:
                if e - s == 1:
                    raise InvalidArgumentError(
                        f"{self.call.method}: the model's output changed shape between calls "
                        f"({exc.got} instead of {exc.expected}); perturbation methods need a "
                        "deterministic output shape",
                        argument="model",
                    ) from None
                # The output does not grow with the batch (it aggregates over examples):
                # fall back to one perturbation per forward, as Captum requires there.
                self.per_example, per = False, 1
                continue
            if inspect is not None:
                inspect(s, e, inputs)
            self.used = max(self.used, e - s)
            progress.done(e - s)
            s = e
        return torch.cat(parts) if len(parts) > 1 else parts[0]


class _ShapeMismatch(Exception):
    def __init__(self, got: tuple[int, ...], expected: tuple[int, ...]) -> None:
        super().__init__()
        self.got, self.expected = got, expected


def _per_chunk(call: Call, perturbation_bytes: int, total: int, working_bytes: int = 0) -> int:
    """Perturbations per forward when the output grows with the batch."""
    spec = call.perturbations_per_eval
    if isinstance(spec, int):
        return max(1, min(spec, total))
    # "auto" (and None): 3x covers the inputs, the activations and the allocator's slack.
    cap = memory_budget(call.inputs[0].device) // (3 * perturbation_bytes)
    if call.inputs[0].device.type == "cpu":  # the caches' rows, N to a perturbation
        n = max(1, call.n)
        cap = min(cap, max(1, cache_rows((working_bytes or perturbation_bytes) // n) // n))
    return max(1, min(total, cap))


def start(call: Call, inputs: Tensors) -> tuple[Evaluator, Tensor]:
    """Evaluate ``inputs`` (one unperturbed batch of N rows) and set up the evaluator.

    For ``"auto"`` chunks this forward also measures what one batch holds: the peak allocation
    on CUDA; elsewhere the tensors autograd would save (every activation the backward needs,
    an upper bound on what a no_grad forward keeps alive), recorded with grad enabled on the
    floating inputs. The measure is deterministic, so the chunking, and therefore the
    rounding, is the same on every call.
    """
    known = _known_bytes(call, inputs)
    if known is not None:
        out = _plain(call, inputs)
    elif inputs[0].device.type == "cuda":
        dev = inputs[0].device
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        base = torch.cuda.memory_allocated(dev)
        out = _plain(call, inputs)
        torch.cuda.synchronize(dev)
        known = Footprint(torch.cuda.max_memory_allocated(dev) - base)
        _remember(call, inputs, known)
    else:
        out, known = _measured(call, inputs)
        _remember(call, inputs, known)
    out = out.reshape(1) if out.dim() == 0 else out
    return _evaluator(call, inputs, out, known), out


def _evaluator(call: Call, inputs: Tensors, out: Tensor, known: Footprint) -> Evaluator:
    io = sum(x.numel() * x.element_size() for x in inputs) + out.numel() * out.element_size()
    return Evaluator(
        call=call,
        out_shape=tuple(out.shape),
        per_example=out.dim() >= 1 and int(out.shape[0]) == call.n,
        perturbation_bytes=max(1, 2 * io, known.nbytes),
        working_bytes=max(2 * io, known.working) if known.working else 0,
    )


def _known_bytes(call: Call, inputs: Tensors) -> Footprint | None:
    """What one batch's forward holds if known without a measuring forward, else None."""
    if isinstance(call.perturbations_per_eval, int):
        return Footprint(0)  # the caller fixed the chunk; nothing to size
    if not any(x.is_floating_point() for x in inputs) and inputs[0].device.type != "cuda":
        # Nothing measurable (integer inputs: token ids, masks): assume a generous blow-up,
        # as from ids to embeddings.
        blowup = sum(x.numel() * x.element_size() for x in inputs) * INTEGER_INPUT_BLOWUP
        return Footprint(blowup)
    cached = _measure_cache.get(_shape_key(call, inputs))
    if cached is not None and cached[0] is not None and cached[0]() is call.model:
        return cached[1]
    return None


def evaluate_with_initial(
    call: Call, inputs: Tensors, total: int, build: Build, *, unperturbed_first: bool = False
) -> tuple[Evaluator, Tensor, Tensor]:
    """``start`` then ``run``, with the unperturbed batch riding in the first chunk's forward
    when no measuring forward is needed (one forward fewer: on small models the per-call cost
    dominates). Returns the evaluator, f(inputs) and the (total, *out_shape) outputs.

    With ``unperturbed_first``, ``build(-1, e)`` makes that first chunk itself: ``inputs``
    then perturbations 0..e-1 (saves concatenating them)."""
    known = _known_bytes(call, inputs)
    per_example = _known_per_example(call, inputs)
    spec = call.perturbations_per_eval
    if known is None or (per_example is None and (spec == 1 or total == 0)):
        # Measure once (then cached) but still take the merged path below, so the first call
        # batches exactly like later ones and returns bit-identical numbers; the measuring
        # forward also says whether the output grows with the batch (a forward that
        # aggregates the batch, or takes only its own rows, as a loss over the batch's labels,
        # is evaluated one perturbation per forward, whatever perturbations_per_eval says)
        ev, initial = start(call, inputs)
        known = _known_bytes(call, inputs) or Footprint(0)
        per_example = ev.per_example
        _remember_per_example(call, inputs, per_example)
        if not per_example or total == 0 or spec == 1:
            return ev, initial, ev.run(total, build)
    if not per_example or total == 0 or spec == 1:
        ev, initial = start(call, inputs)
        return ev, initial, ev.run(total, build)
    n = call.n
    k = min(total, max(1, _per_chunk(call, max(1, known.nbytes), total + 1, known.working) - 1))
    checkpoint()
    try:
        if unperturbed_first:
            both = build(-1, k)
        else:
            both = tuple(torch.cat([x, t]) for x, t in zip(inputs, build(0, k), strict=True))
        sub = call.expanded(k + 1)
        with torch.no_grad():
            raw = sub.target.select_rows(sub.forward(both))
    except torch.OutOfMemoryError:
        raw = None
    except ModelError:
        if per_example is not None:
            raise  # it took stacked batches before: the model's own error
        # unknown yet: a forward that takes only its own batch's rows (a loss closing over
        # the batch's labels): the plain way, one perturbation per forward (a model that
        # fails on its own batch too says so there)
        ev, initial = start(call, inputs)
        ev.per_example = False
        _remember_per_example(call, inputs, False)
        return ev, initial, ev.run(total, build)
    if raw is None or raw.dim() == 0 or int(raw.shape[0]) != (k + 1) * n:
        # The output does not grow with the batch (or memory ran out): the plain way.
        ev, initial = start(call, inputs)
        if raw is not None:
            _remember_per_example(call, inputs, ev.per_example)
        return ev, initial, ev.run(total, build)
    _remember_per_example(call, inputs, True)
    initial, first = raw[:n], raw[n:]
    progress.expect(k)
    progress.done(k)
    ev = _evaluator(call, inputs, initial, known)
    ev.used = k + 1
    first = first.reshape(k, *ev.out_shape)
    if k == total:
        return ev, initial, first
    rest = ev.run(total - k, lambda s, e: build(s + k, e + k))
    return ev, initial, torch.cat([first, rest])


#: measured bytes per batch, per model and input signature: a server attributes the same model
#: and shapes over and over, and the measuring forward costs more than the chunk plan saves
_measure_cache: dict[tuple[object, ...], tuple[weakref.ref[Any] | None, Footprint]] = {}


def _remember(call: Call, inputs: Tensors, known: Footprint) -> None:
    ref = weakref.ref(call.model) if _weakrefable(call.model) else None
    bounded_put(_measure_cache, _shape_key(call, inputs), (ref, known))


#: whether the output grows with the batch, per model and input signature (as above)
_per_example_cache: dict[tuple[object, ...], tuple[weakref.ref[Any] | None, bool]] = {}


def _known_per_example(call: Call, inputs: Tensors) -> bool | None:
    cached = _per_example_cache.get(_shape_key(call, inputs))
    if cached is not None and cached[0] is not None and cached[0]() is call.model:
        return cached[1]
    return None


def _remember_per_example(call: Call, inputs: Tensors, per_example: bool) -> None:
    ref = weakref.ref(call.model) if _weakrefable(call.model) else None
    bounded_put(_per_example_cache, _shape_key(call, inputs), (ref, per_example))


def _weakrefable(obj: object) -> bool:
    try:
        weakref.ref(obj)
    except TypeError:
        return False
    return True


def _shape_key(call: Call, inputs: Tensors) -> tuple[object, ...]:
    sig = tuple((tuple(x.shape), x.dtype, x.device) for x in inputs)
    # id() alone could be reused by a new model after the old one is freed; the weakref stored
    # with the entry is checked on lookup (see start), so a stale id never matches.
    return (id(call.model), sig, call.target.form, call.target.index)


def _plain(call: Call, inputs: Tensors) -> Tensor:
    with torch.no_grad():
        return call.target.select_rows(call.forward(inputs)).detach()


def _measured(call: Call, inputs: Tensors) -> tuple[Tensor, Footprint]:
    leaves = tuple(x.detach().requires_grad_(True) if x.is_floating_point() else x for x in inputs)
    # Clones of the leaves, so that a model starting in place (ReLU(inplace=True)) runs.
    inner = tuple(x.clone() for x in leaves)
    with torch.enable_grad():
        out, saved = count_saved_bytes(
            lambda: call.target.select_rows(call.forward(inner)), keep=False
        )
    return out.detach(), saved


def echo(ev: Evaluator) -> dict[str, object]:
    return {"perturbations_per_eval": ev.used or 1}
