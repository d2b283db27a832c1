"""Chunking expanded evaluations under a memory budget.

Methods describe *what* to evaluate (n_steps x N rows, nt_samples x N rows, ...); this module
decides how many rows go into one forward. ``None`` means everything at once, an int is the
caller's cap on rows per forward, ``"auto"`` sizes the chunk from the memory budget using a
measured cost per row, and on an out-of-memory error halves the chunk and retries.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, overload

import torch
from torch import Tensor

from methods import progress
from methods.cancel import checkpoint
from methods.errors import InvalidArgumentError

BatchSize = int | Literal["auto"] | None
T = TypeVar("T")

DEFAULT_MEMORY_BUDGET = 1 << 30  # bytes per engine call on the CPU; a setting of the service
#: on a CUDA device, with no budget set: this share of the device's free memory at the call.
#: A fixed 1 GiB there cut ResNet-50 integrated gradients on an H200 into chunks of 4 rows,
#: 1.7x Captum's one-pass time (benchmarks.real --device cuda, gpu-check of 2026-11-27)
CUDA_FREE_SHARE = 0.5
_memory_budget: int | None = None  # None: by device (DEFAULT_MEMORY_BUDGET, or CUDA_FREE_SHARE)

#: On a CPU, bigger forwards stop paying once their activations leave the caches: element-wise
#: ops and pooling become memory-bound and fresh large buffers page-fault. "auto" keeps a
#: forward's working set under this: twice its largest activation (an element-wise op reads
#: one and writes one), measured; small models still get everything in one go. The benchmarks'
#: 3x64x64 CNN, integrated gradients: 0.6 ms a row at 32 rows a pass, 1.3 ms at the 416 the
#: memory budget allows (Captum's one pass of 800: the same). Counting every activation instead
#: gave real sizes one perturbation a forward, where a few run faster per row (ms per row at 1 /
#: the working-set chunk, no-grad, 2-core Xeon: BERT-base on 32-token embeddings 46 / 22,
#: ViT-B/16 160 / 139, ResNet-50 54 / 48). 4 MiB, not the 16 first chosen: on the 2-core AMD
#: EPYC (medians of 5, 16 / 4 MiB, one thread | two): exact Shapley values of an MLP over a
#: 10-row background, 200 examples, 199 / 92 ms | 121 / 64 (32k rows a forward ran 2.2x slower
#: per row than 8k); feature ablation of a 32-px CNN 1147 / 796 | 814 / 560; gradient SHAP
#: 143 / 100 | 113 / 108; integrated gradients and occlusion the same within noise.
CPU_CHUNK_BYTES = 4 << 20
#: ... but not below this many rows, where matmul- and conv-bound layers lose more than the
#: caches give (ViT-B/16 forward+backward: 293 ms a row at 2 rows, 275 at 4)
CPU_MIN_ROWS = 4


@dataclass(frozen=True)
class Footprint:
    """What a forward (of one row, or one batch) holds, ``nbytes`` (every activation autograd
    saves: the memory budget's measure), and works on, ``working`` (twice its largest
    activation: an element-wise op reads one and writes one; the caches' measure; 0 where
    unknown)."""

    nbytes: int
    working: int = 0

    def scaled(self, factor: float) -> Footprint:
        return Footprint(max(1, math.ceil(self.nbytes * factor)), math.ceil(self.working * factor))


#: the most rows an "auto" chunk may hold where a caller set one (``at_most``); None: no cap
_row_cap: ContextVar[int | None] = ContextVar("row_cap", default=None)


@contextmanager
def at_most(rows: int) -> Iterator[None]:
    """Within the block, ``"auto"`` puts no more than ``rows`` rows in a chunk (a path still
    takes one step of every example); an explicit ``internal_batch_size`` stands.

    For a caller that merges into one call what Captum runs as several (every answer token of
    a generation), so that "auto" holds no more at once than Captum's own pass: on a CUDA
    device half the free memory otherwise put GPT-2 small's 10 answer tokens x 50 steps in one
    pass, 18.6 GB at peak against Captum's 2.5 GB (benchmarks.real on an H200)."""
    token = _row_cap.set(max(1, int(rows)))
    try:
        yield
    finally:
        _row_cap.reset(token)


def cache_rows(working_per_row: int) -> int:
    """Rows per forward that keep a CPU forward's working set in the caches."""
    return max(CPU_MIN_ROWS, CPU_CHUNK_BYTES // max(1, working_per_row))


def set_memory_budget(nbytes: int | None) -> None:
    """Set the working-memory budget that ``"auto"`` batch sizes are derived from (``None``:
    by device: 1 GiB on the CPU, half the free memory of a CUDA device)."""
    global _memory_budget
    if nbytes is not None and nbytes < 1:
        raise InvalidArgumentError("the memory budget must be positive", argument="memory_budget")
    _memory_budget = None if nbytes is None else int(nbytes)


def memory_budget(device: torch.device | None = None) -> int:
    """The budget set, else the device's: ``DEFAULT_MEMORY_BUDGET``, or on a CUDA device
    ``CUDA_FREE_SHARE`` of its free memory (never less than the CPU's)."""
    if _memory_budget is not None:
        return _memory_budget
    if device is not None and device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return max(DEFAULT_MEMORY_BUDGET, int(free * CUDA_FREE_SHARE))
    return DEFAULT_MEMORY_BUDGET


def check_batch_size(value: object, argument: str) -> BatchSize:
    if value is None or value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"{argument} must be None, 'auto' or an integer >= 1, got {value!r}", argument=argument
        )
    return value


def count_saved_bytes(run: Callable[[], T], *, keep: bool = True) -> tuple[T, Footprint]:
    """Run ``run`` and count the bytes autograd saves for backward meanwhile: the result, and
    the ``Footprint`` of what was saved (the total; twice the largest single tensor).

    Tensors are counted by storage, once each; parameters and views of them (the
    ``weight.t()`` a linear layer's backward saves: ~56 MiB per two BERT-base layers, against
    ~15 MiB of real activations per 128-token row) are excluded: they are not per row.

    ``keep=False``, for a forward that is only measured (no backward follows): what is saved
    is counted and let go, so the forward holds what a no-grad one holds (ViT-B/16 at 224 px:
    113 MiB a row otherwise, the peak of a perturbation method's first call). A forward that
    differentiates inside itself (a force field's -dE/dx) needs what it saved: it is run
    again, keeping it.
    """
    if not keep:
        try:
            return _count_saved_bytes(run, keep=False)
        except Exception as exc:
            if not caused_by(exc, lambda e: isinstance(e, _Dropped)):
                raise
    return _count_saved_bytes(run, keep=True)


class _Dropped(RuntimeError):
    """A tensor ``count_saved_bytes(keep=False)`` let go was asked for by a backward."""


def caused_by(exc: BaseException, test: Callable[[BaseException], bool]) -> bool:
    """Whether ``exc`` or any exception in its chain of causes and contexts passes ``test``."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if test(cur):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _unpack(packed: object) -> Tensor:
    if not isinstance(packed, Tensor):
        raise _Dropped("a saved tensor was let go: the run differentiates inside itself")
    return packed


def _count_saved_bytes(run: Callable[[], T], *, keep: bool) -> tuple[T, Footprint]:
    seen: dict[int, weakref.ref[Tensor] | None] = {}  # None: kept, so alive
    total = largest = 0

    def pack(t: Tensor) -> Tensor | None:  # None: let go
        nonlocal total, largest
        base = t
        while base._base is not None:
            base = base._base
        if isinstance(base, torch.nn.Parameter):
            return t if keep else None
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
            # a storage let go may hand its address to a later one: the same storage only
            # while the tensor first seen there lives
            ref = seen.get(key)
            if key not in seen or (ref is not None and ref() is None):
                seen[key] = None if keep else weakref.ref(base)
                total += storage.nbytes()
                largest = max(largest, storage.nbytes())
        except (RuntimeError, NotImplementedError):  # e.g. sparse or meta tensors
            total += t.numel() * t.element_size()
            largest = max(largest, t.numel() * t.element_size())
        return t if keep else None

    with torch.autograd.graph.saved_tensors_hooks(pack, _unpack):
        result = run()
    return result, Footprint(total, 2 * largest)


#: set while ``row_bytes_estimate`` runs: the engine's backward ends the run (``forward_done``)
_forward_only: ContextVar[bool] = ContextVar("forward_only", default=False)


class _ForwardDone(Exception):
    """Raised by ``forward_done`` to end a measured run where its backward would start."""


def model_call() -> Token[bool]:
    """Entered around a call of the model (``Forward``): a backward the model runs inside
    itself, even through the engine (a model that attributes), is the model's own and runs;
    pass the token to ``model_returned``."""
    return _forward_only.set(False)


def model_returned(token: Token[bool]) -> None:
    _forward_only.reset(token)


def forward_done() -> None:
    """Called by the engine where a backward of its forward starts. While a row's cost is
    measured, everything autograd saves has been counted by then: the run ends there, without
    the backward (twice the forward's time: ViT-B/16's first integrated-gradients call measured
    a row in 0.35 s with it)."""
    if _forward_only.get():
        raise _ForwardDone


def row_bytes_estimate(run: Callable[[], object], n_rows: int, extra_per_row: int = 0) -> Footprint:
    """What one forward+backward row holds and works on: what autograd saves for backward,
    measured.

    ``run`` performs one grad-enabled forward over ``n_rows`` rows, then differentiates it; the
    run ends where the engine's backward starts (``forward_done``; a backward the engine does
    not announce runs as before), and what the forward saved is let go as it is counted.
    """

    def forward() -> None:
        token = _forward_only.set(True)
        try:
            run()
        except _ForwardDone:
            pass
        finally:
            _forward_only.reset(token)

    _, saved = count_saved_bytes(forward, keep=False)
    rows = max(1, n_rows)
    return Footprint(max(1, saved.nbytes // rows + extra_per_row), saved.working // rows)


# Measuring costs a forward pass; a served model sees the same shapes again and again.
#: per model: bytes per row by shape key, and (size, bytes) by ("family", key)
_MEASURED: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = weakref.WeakKeyDictionary()
#: measurements kept per model (shape keys seen); the oldest goes first, as clients may send
#: ever new shapes (token sequences of every length)
MEASURED_PER_MODEL = 256


#: a measurement stands for examples of its family up to this many times smaller or larger
SCALE_WITHIN = 4.0


Cost = TypeVar("Cost", int, Footprint)


def measured_once(
    owner: Any,
    key: Hashable,
    measure: Callable[[], Cost],
    family: tuple[Hashable, int] | None = None,
) -> Callable[[], Cost]:
    """``measure`` memoised per (owner, key); owner is the model (held weakly).

    ``family``: (the key without sizes, the example's size in elements). A key not measured
    yet whose family was is scaled from that measurement instead of measured again: linearly
    to a smaller example, quadratically to a larger one (attention grows with the square of
    a text's length), so texts of similar lengths cost one measuring pass, not one each, and
    the estimate errs towards smaller chunks; beyond ``SCALE_WITHIN`` times the reference's
    size an example is measured and becomes the reference."""

    def get() -> Cost:
        try:
            per_owner = _MEASURED.setdefault(owner, {})
        except TypeError:  # not weak-referenceable: measure every time
            return measure()
        found = per_owner.get(key)
        if found is None:
            kin = per_owner.get(("family", family[0])) if family is not None else None
            ratio = family[1] / kin[0] if kin is not None and family is not None else 0.0
            if kin is not None and 1 / SCALE_WITHIN <= ratio <= SCALE_WITHIN:
                factor = ratio * ratio if ratio > 1 else ratio
                ref = kin[1]
                found = (
                    ref.scaled(factor)
                    if isinstance(ref, Footprint)
                    else max(1, math.ceil(ref * factor))
                )
            else:  # the family's first, or too far from its reference: measured (the reference)
                found = measure()
                if family is not None:
                    _keep(per_owner, ("family", family[0]), (family[1], found))
            _keep(per_owner, key, found)
        return cast(Cost, found)  # what measure() gave, or its scaled copy

    return get


def _keep(per_owner: dict[Hashable, Any], key: Hashable, value: Any) -> None:
    while len(per_owner) >= MEASURED_PER_MODEL:
        per_owner.pop(next(iter(per_owner)))  # the oldest entry
    per_owner[key] = value


def rows_per_chunk(
    spec: BatchSize,
    total_rows: int,
    row_bytes: Callable[[], int | Footprint],
    granule: int = 1,
    device: torch.device | None = None,
) -> int:
    """Rows per forward, a multiple of ``granule`` (e.g. the number of examples) where possible.

    ``"auto"``: as many as the memory budget holds, at 3x a row's bytes (activations, their
    gradients and the allocator's slack); on a CPU no more than keeps the working set in the
    caches (``CPU_CHUNK_BYTES``), where the row's cost says what it works on; and no more than
    a caller's ``at_most``."""
    if spec is None:
        return total_rows
    if spec == "auto":
        cost = row_bytes()
        cost = cost if isinstance(cost, Footprint) else Footprint(cost)
        rows = memory_budget(device) // (3 * cost.nbytes)
        if cost.working and device is not None and device.type == "cpu":
            rows = min(rows, cache_rows(cost.working))
        cap = _row_cap.get()
        if cap is not None:
            rows = min(rows, cap)
    else:
        rows = int(spec)
    rows = max(granule, (rows // granule) * granule) if rows >= granule else max(1, rows)
    return min(total_rows, rows)


@overload
def run_chunks(
    total: int, per_chunk: int, fn: Callable[[int, int], T], *, retry_oom: bool
) -> tuple[list[T], int]: ...


@overload
def run_chunks(
    total: int,
    per_chunk: int,
    fn: Callable[[int, int], T],
    *,
    retry_oom: bool,
    reduce: Callable[[T, T], T],
) -> tuple[T, int]: ...


def run_chunks(
    total: int,
    per_chunk: int,
    fn: Callable[[int, int], T],
    *,
    retry_oom: bool,
    reduce: Callable[[T, T], T] | None = None,
) -> tuple[list[T] | T, int]:
    """Call ``fn(start, end)`` over [0, total) in chunks; returns results and the chunk used.

    With ``reduce`` the results are folded as they arrive (``acc = reduce(acc, part)``, from
    the first chunk's result), so only the running total and one chunk are alive; without it,
    the list of every chunk's result. ``total`` must be >= 1 with ``reduce``. With
    ``retry_oom`` an out-of-memory error halves the chunk and repeats that chunk only. A
    cancelled attribution (``methods.cancel``) stops before the next chunk.
    """
    results: list[T] = []
    acc: T | None = None
    start = 0
    per_chunk = max(1, per_chunk)
    progress.expect(total)
    while start < total:
        checkpoint()
        end = min(total, start + per_chunk)
        try:
            part = fn(start, end)
        except torch.OutOfMemoryError:
            if not retry_oom or per_chunk == 1:
                raise
            per_chunk = max(1, per_chunk // 2)
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            continue
        if reduce is None:
            results.append(part)
        else:
            acc = part if start == 0 else reduce(acc, part)  # type: ignore[arg-type]
            del part
        progress.done(end - start)
        start = end
    if reduce is None:
        return results, per_chunk
    if acc is None:
        raise ValueError("run_chunks: nothing to reduce (total < 1)")
    return acc, per_chunk
