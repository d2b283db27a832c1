"""What crosses the process boundary: work and batches as plain picklable data (their replies:

Work is typed: ``Work`` holds what the pool and the worker loop need of any work (whose, how
many examples, what it costs, until when), and each kind of work is a small dataclass of its
own fields (an attribution, a prediction, a TCAV query, ...). The worker runs a piece of work
by its type, through one table (``RUNS``): the module that defines a work type registers its
run with ``@runs``, so unpickling the work in the worker imports its run too.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

from service.core.reply import Reply

#: a resolved target as plain data (``service.wire.targets``): None, or a dict with a "form"
WireTarget = dict[str, Any] | None
#: a new work id (unique in the server process)
new_id = itertools.count(1).__next__
W = TypeVar("W", bound="Work")
#: each kind of work by its class name (the job store names a stored work's type)
WORK_TYPES: dict[str, type[Work]] = {}


#: which examples of a piece of work: a run ``slice(start, stop)``, or their indices
Index = slice | np.ndarray


def picked(items: Any, index: Index) -> Any:
    """A list's (or tuple's) entries at ``index`` (a slice, or an array of indices); an empty
    one (no texts: tensor inputs) stays empty."""
    if isinstance(index, slice) or not items:
        return items[index] if isinstance(index, slice) else items
    chosen = [items[int(i)] for i in index]
    return tuple(chosen) if isinstance(items, tuple) else chosen


def rows(value: Any, n: int, ndim: int | tuple[int, ...], index: Index) -> Any:
    """Per-example arrays cut to the examples at ``index``: those with the batch dim (as many
    dims as their input, ``ndim``, and ``n`` rows, ``n`` > 1). Others go whole: one row
    broadcasts, and an array without the batch dim (a ``feature_mask`` of shape [C, H, W] for
    [N, C, H, W] inputs) is the same for every example, whatever its first dim."""
    if isinstance(value, np.ndarray):
        want = ndim if isinstance(ndim, int) else ndim[0]
        per_example = n > 1 and value.ndim == want and value.shape[0] == n
        return value[index] if per_example else value
    if isinstance(value, tuple):  # one per input
        dims = ndim if isinstance(ndim, tuple) else (ndim,) * len(value)
        if len(dims) != len(value):
            dims = (dims[0],) * len(value)
        return tuple(rows(v, n, d, index) for v, d in zip(value, dims, strict=True))
    if isinstance(value, dict):
        return {k: rows(v, n, ndim, index) for k, v in value.items()}
    return value


def cut_target(target: WireTarget, index: Index) -> WireTarget:
    """A resolved target cut to the examples at ``index`` (one for all stays whole)."""
    if target is not None and target["form"] in ("per_example", "per_example_tuple", "box"):
        return {**target, "rows": picked(target["rows"], index)}
    if target is not None and target["form"] == "region":  # a class (and a mask) per example
        masks = target["masks"]
        return {**target, "rows": picked(target["rows"], index),
                "masks": None if masks is None else masks[index]}  # fmt: skip
    return target


@dataclass(kw_only=True)
class Work:
    """One validated request's work, ready for the worker (arrays stay numpy until there)."""

    #: what the pool's measured rates and the logs call this kind of work
    label: ClassVar[str] = "work"
    #: its examples are independent: a job runs it in chunks of examples (False: whole, in
    #: one chunk, e.g. TCAV, whose scores count over all the examples)
    divisible: ClassVar[bool] = True

    id: int
    model_id: str
    n: int  # examples
    cost: int  # estimated forward rows
    arrays: tuple[np.ndarray, ...] = ()
    #: raw texts (or pairs of texts) for the model's tokenizer
    texts: tuple[str | tuple[str, str], ...] = ()
    #: token models: the most tokens a text may have
    max_tokens: int | None = None
    deadline: float = 0.0  # time.time() after which the work is abandoned
    #: work with equal keys may be merged into one call; None: never merged
    key: tuple[Any, ...] | None = None
    #: the HTTP request's X-Request-ID, for the worker's log lines
    request_id: str = ""
    #: a chunk of a job: runs when no synchronous request waits (or when jobs are owed their
    #: share of worker time), never merged, preempted by synchronous work
    background: bool = False
    #: images sent encoded: each file's bytes, which pictures draw over (``arrays`` holds their
    #: ``pixel_values``); kept by the server, never sent to a worker or stored with a job
    images: tuple[bytes, ...] = field(default=(), repr=False)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        WORK_TYPES[cls.__name__] = cls

    @property
    def name(self) -> str:
        """What the pool keeps this work's cost rate under: its label, or an attribution's
        method."""
        return self.label

    def cut(self: W, start: int, stop: int) -> W:
        """The work of examples ``[start, stop)`` alone (a job's chunk, a request's piece):
        inputs and every per-example field cut, the cost shared out; never merged."""
        return self.take(slice(start, stop))

    def take(self: W, index: Index) -> W:
        """The work of the examples at ``index`` alone (a slice, or their indices: those a
        condition chose), as ``cut``."""
        size = len(range(self.n)[index]) if isinstance(index, slice) else len(index)
        ndim = tuple(a.ndim for a in self.arrays) or (2,)  # token ids from texts: [N, L]
        return dataclasses.replace(
            self,
            arrays=tuple(a[index] for a in self.arrays),
            texts=picked(self.texts, index),
            n=size,
            cost=max(1, self.cost * size // max(1, self.n)),
            key=None,
            **self._cut_fields(ndim, index),
        )

    def _cut_fields(self, ndim: tuple[int, ...], index: Index) -> dict[str, Any]:
        """A kind of work's own per-example fields cut to the examples at ``index``."""
        return {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "images": ()}


def labels() -> frozenset[str]:
    """Every kind of work's label (what metrics may name besides the engine's methods)."""
    return frozenset(t.label for t in WORK_TYPES.values())


#: the worker's run of each kind of work: ``(loaded model, work) -> Reply``
RUNS: dict[type[Work], Callable[[Any, Any], Reply]] = {}


def runs(kind: type[W]) -> Callable[[Callable[[Any, W], Reply]], Callable[[Any, W], Reply]]:
    """Register ``fn`` as the worker's run of ``kind`` (one run per kind of work)."""

    def register(fn: Callable[[Any, W], Reply]) -> Callable[[Any, W], Reply]:
        if kind in RUNS:
            raise ValueError(f"{kind.__name__} already has a run")
        RUNS[kind] = fn
        return fn

    return register


def run(lm: Any, work: Work) -> Reply:
    """``work`` on its loaded model, by the run its type registered."""
    try:
        fn = RUNS[type(work)]
    except KeyError:
        raise TypeError(f"no run is registered for {type(work).__name__}") from None
    return fn(lm, work)


def retyped(work: W, kind: type[W]) -> W:
    """``work`` as the same work of a subclass ``kind`` (a task's own run): every field
    copied, its merge key too."""
    out = kind(**{f.name: getattr(work, f.name) for f in dataclasses.fields(work) if f.init})
    for f in dataclasses.fields(work):
        if not f.init:
            setattr(out, f.name, getattr(work, f.name))
    return out


@dataclass(kw_only=True)
class Prediction(Work):
    """The model's whole output for the inputs (KServe ``:predict``, OIP infer)."""

    label: ClassVar[str] = "predict"
    #: the model's whole output per example is the answer (as ``Attribution.predictions``)
    predictions: ClassVar[bool] = True


@dataclass(kw_only=True)
class Attribution(Work):
    """An engine method on the inputs (``methods.attribute``), as checked and resolved."""

    label: ClassVar[str] = "attribution"

    method: str  # the method the engine runs
    target: WireTarget = None
    baselines: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    internal_batch_size: int | str | None = None
    perturbations_per_eval: int | str | None = None
    noise_tunnel: dict[str, Any] | None = None
    seed: int | None = None
    return_delta: bool = False
    #: the method the request named (``method`` is what the engine runs: a token model's
    #: gradient method is rewritten onto its embedding layer); None: the same
    requested: str | None = None
    #: token models: the embedding layer a rewritten gradient method attributes to (summed)
    attributed_layer: str | None = None
    #: saliency rewritten onto a layer: take the absolute value before summing
    post_abs: bool = False
    #: also return the model's whole output per example (KServe/OIP explain)
    predictions: bool = False
    #: also compare with the model's float64 CPU copy, or with a low ``precision`` with the
    #: float32 answer (never merged)
    verify: bool = False
    #: the dtype the model runs in (``methods.engine.precision``); None: the model's own
    precision: str | None = None
    #: a checked low-precision answer further than this from float32 (relative L2, worst
    #: example) is replaced by the float32 one (models.toml ``fidelity_tolerance``)
    fidelity_tolerance: float = 0.05
    #: explanation metrics to compute after the attributions (``methods.evaluation.
    #: parse_metrics``' form: every metric asked for with all its parameters); None: none
    metrics: dict[str, dict[str, Any]] | None = None
    #: baselines drawn from as a distribution (the method's ``merge`` is "shared_baselines"):
    #: never cut with the examples
    shared_baselines: bool = False
    #: the scale attributed (``methods.engine.outputs``): raw, probability, ...
    output: str = "raw"
    #: each label its own sigmoid (a multi-label model's probabilities)
    multi_label: bool = False
    #: the mask param whose superpixels the server drew (``service.kinds.features``): the
    #: answer returns them; None: none drawn
    drawn: str | None = None
    #: what a text's features are (``units``): its tokens, or words, sentences, paragraphs
    units: str = "token"

    @property
    def name(self) -> str:
        return self.method

    def _cut_fields(self, ndim: tuple[int, ...], index: Index) -> dict[str, Any]:
        baselines = self.baselines
        if not self.shared_baselines:  # else a distribution, sampled
            baselines = rows(baselines, self.n, ndim, index)
        return {
            "target": cut_target(self.target, index),
            "baselines": baselines,
            "params": rows(self.params, self.n, ndim, index),
        }


@dataclass(kw_only=True)
class Generation(Work):
    """A causal LM's answer attributed to its prompt (``methods.attribute_generation``)."""

    label: ClassVar[str] = "generation"

    method: str
    params: dict[str, Any] = field(default_factory=dict)
    internal_batch_size: int | str | None = None
    perturbations_per_eval: int | str | None = None
    seed: int | None = None
    #: the prompt, features, baselines, skip_tokens, target text and gen_args
    #: (``service.kinds.causal_lm``)
    generation: dict[str, Any] = field(default_factory=dict)
    #: as ``Attribution``'s: the dtype the model runs in (None: its own), compared with
    #: float32 (and replaced beyond ``fidelity_tolerance``) when ``verify``
    precision: str | None = None
    verify: bool = False
    fidelity_tolerance: float = 0.05

    @property
    def name(self) -> str:
        return self.method


@dataclass
class Batch:
    id: int
    works: list[Work]
    #: torch intra-op threads to compute on (``service.pool.cores``)
    threads: int = 1
