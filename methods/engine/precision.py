"""Precision: the model's forward and backward in a low dtype, the engine's sums in float32.

``precision="bfloat16"`` (or ``"float16"``, or ``"float32"`` for a model kept in a 16-bit
dtype) runs the model as a copy cast to that dtype, made once per model and dtype and kept
while the model's parameters are unchanged (``twin``). Everything the engine computes itself
stays in float32: floating inputs are cast on the way into the copy and its output back on
the way out (``Cast``), and a tapped layer hands the engine float32 values and takes them back
in the layer's dtype (``boundary``), so path points, baselines differences, quadrature weights
and the sums over steps never round to 8 bits. The whole forward and backward run in one
dtype: no per-op casts as under ``torch.autocast``, which is what lets bfloat16 reach the
matrix units.

Low precision is a speed lever with a price in accuracy that depends on the model (small on
transformers, large on deep ReLU conv nets), so every low-precision answer says what it cost
(``Fidelity``): the convergence delta relative to the output gap where the method has one,
and with ``verify`` the float32 answer's relative L2 distance and top-k agreement. An answer
whose verification fails the tolerance is replaced by the float32 one, and says so.
``precision="auto"`` measures once per model, method and input family (``Probe``) and keeps
the fastest precision whose answer passed.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from methods.engine import hooks
from methods.errors import InvalidArgumentError, UnsupportedModelError, positive_number

#: what ``precision`` accepts
PRECISIONS = ("float32", "bfloat16", "float16", "auto")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: the low dtypes: a layer tap hands the engine float32 from these, and scores are taken
#: from logits widened out of them
LOW_DTYPES = (torch.bfloat16, torch.float16)
#: the largest relative L2 distance from the float32 answer a low-precision answer may have
TOLERANCE = 0.05
#: how many of an example's largest |attributions| the top-k agreement compares
TOP_K = 10
#: ``auto`` keeps a low precision only when it is at least this much faster than float32
SPEED_UP = 1.2


def check_tolerance(value: object) -> float:
    """``fidelity_tolerance``: a positive finite number (None: ``TOLERANCE``)."""
    if value is None:
        return TOLERANCE
    return positive_number(value, "fidelity_tolerance", "fidelity_tolerance (a relative L2 error)")


def check_precision(value: Any) -> str | None:
    """``value`` as a precision name, or None (the model's own dtype)."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in PRECISIONS:
        raise InvalidArgumentError(
            f"precision must be one of {list(PRECISIONS)} or null, got {value!r}",
            argument="precision",
        )
    return value


def model_dtype(model: Any) -> torch.dtype:
    """The dtype of the model's floating parameters (float32 when it has none)."""
    if isinstance(model, nn.Module):
        for p in model.parameters():
            if p.is_floating_point():
                return p.dtype
    return torch.float32


# -- the low-precision copy -----------------------------------------------------------------


def _fingerprint(model: nn.Module) -> tuple[Any, ...]:
    """Changes when a parameter or buffer is replaced or written in place, or a module's mode
    changes (a copy made in training mode would keep its dropout)."""
    tensors = tuple((t.data_ptr(), t._version) for t in (*model.parameters(), *model.buffers()))
    return (tensors, tuple(m.training for m in model.modules()))


_TWINS: weakref.WeakKeyDictionary[nn.Module, dict[torch.dtype, tuple[Any, nn.Module]]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def twin(model: Any, dtype: torch.dtype) -> nn.Module:
    """A copy of ``model`` cast to ``dtype``, made once per model and dtype and made again
    when the model's weights change; the caller's model is never touched."""
    if isinstance(model, torch.export.ExportedProgram) or not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"precision casts a copy of the model, so the model must be a torch.nn.Module, got "
            f"{type(model).__name__}; leave precision unset for this model",
            argument="precision",
        )
    with _LOCK:
        print_ = _fingerprint(model)
        found = _TWINS.setdefault(model, {}).get(dtype)
        if found is not None and found[0] == print_:
            return found[1]
        copied = _cast_copy(model, dtype)
        _TWINS[model][dtype] = (print_, copied)
        return copied


def _cast_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of ``model`` with its floating parameters and buffers made in ``dtype``
    directly (never a full-precision copy first: a large LM on a full GPU), ties between
    parameters kept, without the hooks another call of the engine holds on it meanwhile."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        if id(p) not in memo:
            data = p.detach().to(dtype) if p.is_floating_point() else p.detach().clone()
            memo[id(p)] = nn.Parameter(data, requires_grad=p.requires_grad)
    for b in model.buffers():
        if id(b) not in memo:
            memo[id(b)] = b.detach().to(dtype) if b.is_floating_point() else b.detach().clone()
    with hooks.held_while() as held:
        copied = copy.deepcopy(model, memo)
        hooks.strip(copied, held)
    # what a module does on a cast besides its tensors (an RNN regroups its weights); its
    # tensors are in dtype already, so nothing is copied again
    return copied.to(dtype=dtype)


def forget(model: Any, keep: torch.dtype | None = None) -> None:
    """Let go of ``model``'s cast copies but ``keep``'s."""
    if not isinstance(model, nn.Module):
        return
    with _LOCK:
        copies = _TWINS.get(model, {})
        for dtype in [d for d in copies if d != keep]:
            del copies[dtype]


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor):
        return value.to(dtype) if value.is_floating_point() and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


class Cast:
    """``model`` run in ``dtype``: floating arguments cast in, a floating output cast back to
    float32 (differentiably, so gradients reach float32 inputs in float32)."""

    __slots__ = ("dtype", "model")

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.model, self.dtype = model, dtype

    def __call__(self, *args: Any) -> Any:
        with boundary(self.dtype):
            out = self.model(*_cast(args, self.dtype))
        if isinstance(out, Tensor) and out.is_floating_point() and out.dtype != torch.float32:
            return out.float()
        return out


#: the dtype a model runs in under ``Cast`` (layer taps convert at this boundary)
_working: ContextVar[torch.dtype | None] = ContextVar("working_dtype", default=None)


@contextmanager
def boundary(dtype: torch.dtype) -> Iterator[None]:
    token = _working.set(dtype)
    try:
        yield
    finally:
        _working.reset(token)


def working_dtype() -> torch.dtype | None:
    """The low dtype the model is running in, inside ``Cast``; None otherwise."""
    return _working.get()


# -- what the precision cost ----------------------------------------------------------------


@dataclass(frozen=True)
class Fidelity:
    """What computing in a precision cost, against float32 where it was measured (CONTRACT
    8.1's names)."""

    #: the precision of the returned numbers (float32 after a fallback)
    precision: str
    #: per example, |convergence delta| / |f(x) - f(baseline)|, where the method has a delta
    delta_ratio: list[float] | None = None
    #: compared with a float32 computation (``verify``, a sampled check, or ``auto``'s probe)
    checked: bool = False
    #: when checked: ||a - a_float32|| / ||a_float32|| of the worst example
    rel_l2: float | None = None
    #: when checked: the share of the top-k |attributions| the float32 answer shares, for the
    #: worst example
    topk_agreement: float | None = None
    #: the low-precision answer failed the check and the answer is the float32 one
    fallback: bool = False
    #: with ``fallback``: the precision that was tried and failed
    tried: str | None = None
    top_k: int | None = None
    tolerance: float = TOLERANCE
    #: for ``auto``: why this precision was kept
    chosen: str | None = None

    @property
    def ok(self) -> bool:
        return self.rel_l2 is None or self.rel_l2 <= self.tolerance

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def of(cls, dtype: torch.dtype) -> Fidelity:
        """An answer computed in ``dtype`` with nothing to measure against (no delta, no
        float32 check): what a program that returns attributions or a generative model says."""
        return cls(str(dtype).removeprefix("torch."))


def flat(value: Any) -> list[Tensor]:
    """The tensors of an attribution value (a tensor, tuples, or a list of layers' values)."""
    if isinstance(value, Tensor):
        return [value]
    out: list[Tensor] = []
    for v in value or ():
        out.extend(flat(v))
    return out


def compare(
    got: Any, ref: Any, view: Callable[[Tensor], Tensor] | None = None
) -> tuple[float, float, int]:
    """For the worst example: the relative L2 distance of ``got`` from ``ref`` (largest) and
    the share of its top-k |attributions| that ``ref`` shares (smallest); and the k used.
    ``view`` maps each tensor first (a token model's: one score per token)."""
    see = view or (lambda t: t)
    a = [see(x.detach()).cpu() for x in flat(got)]  # the two may sit on different devices
    r = [see(y.detach()).cpu() for y in flat(ref)]
    n = r[0].shape[0] if r and r[0].dim() else 1
    rows_a = torch.cat([x.reshape(n, -1).double() for x in a], dim=1)
    rows_r = torch.cat([y.reshape(n, -1).double() for y in r], dim=1)
    num = (rows_a - rows_r).pow(2).sum(1)
    den = rows_r.pow(2).sum(1)
    zero = torch.where(num == 0, 0.0, float("inf")).to(num.dtype)
    rel = float(torch.where(den > 0, (num / den.clamp(min=1e-300)).sqrt(), zero).max())
    k = min(TOP_K, rows_r.shape[1])
    if k == 0:
        return rel, 1.0, 0
    top_a = rows_a.abs().topk(k, dim=1).indices
    top_r = rows_r.abs().topk(k, dim=1).indices
    shared = [
        len(set(ta.tolist()) & set(tr.tolist())) / k for ta, tr in zip(top_a, top_r, strict=True)
    ]
    return rel, min(shared), k


def delta_ratio(delta: Any, gap: Tensor | None) -> list[float] | None:
    """Per example, |delta| / |f(x) - f(b)| (a zero gap counts its delta as is); with a
    delta per tensor, each example's largest."""
    if gap is None or delta is None:
        return None
    g = gap.detach().double().abs().reshape(-1)
    worst = torch.zeros_like(g)
    for d in flat(delta):
        d = d.detach().double().abs().reshape(-1)
        if d.shape != g.shape:
            return None
        worst = torch.maximum(worst, d / torch.where(g > 0, g, torch.ones_like(g)))
    return [float(v) for v in worst]


# -- auto -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """``auto``'s measurement for one model, method and input family."""

    precision: str
    seconds: dict[str, float]
    relative_l2: dict[str, float]
    tolerance: float = TOLERANCE

    def table(self) -> dict[str, dict[str, Any]]:
        """Per precision tried: its worst example's relative L2 from float32, whether that is
        within tolerance, and its speed as a multiple of float32's."""
        f32 = self.seconds["float32"]
        return {
            p: {"rel_l2": r, "ok": r <= self.tolerance, "speedup": f32 / self.seconds[p]}
            for p, r in self.relative_l2.items()
        }

    def reason(self) -> str:
        f32 = self.seconds["float32"]
        parts = [
            f"{p}: {f32 / s:.2f}x float32's speed, relative L2 {self.relative_l2[p]:.2g}"
            for p, s in self.seconds.items()
            if p != "float32"
        ]
        return f"kept {self.precision} ({'; '.join(parts) or 'no lower precision to try'})"


_PROBES: weakref.WeakKeyDictionary[nn.Module, dict[Any, Probe]] = weakref.WeakKeyDictionary()


def cpu_has_bfloat16() -> bool:
    """Whether this CPU multiplies bfloat16 matrices in hardware (AVX512-BF16 or AMX). Without
    it oneDNN emulates them: measured here on an AVX2 CPU, a BERT-base forward and backward ran
    40x slower in bfloat16 than in float32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in checks)


def candidates(device: torch.device) -> list[str]:
    """Low precisions worth trying on ``device``: bfloat16 on CPUs with bfloat16 units and on
    GPUs that support it, float16 on GPUs."""
    if device.type == "cuda":
        low = ["bfloat16"] if torch.cuda.is_bf16_supported() else []
        return [*low, "float16"]
    if device.type == "cpu" and cpu_has_bfloat16():
        return ["bfloat16"]
    return []


def probes_of(model: Any) -> list[Probe]:
    """Every probe measured on ``model``, oldest first."""
    if not isinstance(model, nn.Module):
        return []
    with _LOCK:
        return list(_PROBES.get(model, {}).values())


def known_probe(model: Any, key: Any) -> Probe | None:
    if not isinstance(model, nn.Module):
        return None
    with _LOCK:
        return _PROBES.get(model, {}).get(key)


def probe(
    model: nn.Module,
    key: Any,
    device: torch.device,
    run: Callable[[str], Any],
    tolerance: float = TOLERANCE,
) -> tuple[Probe, dict[str, Any]]:
    """Run ``run(precision)`` in float32 and in each candidate precision (each twice where
    there is a candidate, the first a warm-up), keep the fastest whose answer is within
    ``tolerance`` of float32's, and remember the choice for ``key``. Returns the probe and
    every answer by precision."""
    answers: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    rel: dict[str, float] = {}
    lows = candidates(device)
    if lows:  # every precision is timed warm: a cold first call made the low ones look fast
        run("float32")
    start = time.perf_counter()
    answers["float32"] = run("float32")
    seconds["float32"] = time.perf_counter() - start
    ref = answers["float32"].attributions
    chosen = "float32"
    for p in lows:
        try:
            run(p)  # warm-up: the copy, kernels' first-call set-up
            start = time.perf_counter()
            answers[p] = run(p)
            seconds[p] = time.perf_counter() - start
        except (RuntimeError, NotImplementedError):  # an op without a kernel in p
            continue
        rel[p] = compare(answers[p].attributions, ref)[0]
        fast = seconds[p] * SPEED_UP <= seconds[chosen]
        if rel[p] <= tolerance and fast:
            chosen = p
    found = Probe(chosen, seconds, rel, tolerance)
    with _LOCK:
        _PROBES.setdefault(model, {})[key] = found
    # the copies tried and not kept are let go (a GPU would hold a bfloat16 and a float16 one)
    forget(model, keep=DTYPES[chosen])
    return found, answers
