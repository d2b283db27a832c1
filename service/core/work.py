"""What crosses the process boundary: work, batches and replies, as plain picklable data.

Work is typed: ``Work`` holds what the pool and the worker loop need of any work (whose, how
many examples, what it costs, until when), and each kind of work is a small dataclass of its
own fields (an attribution, a prediction, a TCAV query, ...). The worker runs a piece of work
by its type, through one table (``RUNS``): the module that defines a work type registers its
run with ``@runs``, so unpickling the work in the worker imports its run too.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np

#: a resolved target as plain data (``service.wire.targets``): None, or a dict with a "form"
WireTarget = dict[str, Any] | None
#: a new work id (unique in the server process)
new_id = itertools.count(1).__next__
W = TypeVar("W", bound="Work")
#: each kind of work by its class name (the job store names a stored work's type)
WORK_TYPES: dict[str, type[Work]] = {}


def rows(value: Any, n: int, ndim: int | tuple[int, ...], start: int, stop: int) -> Any:
    """Per-example arrays cut to ``[start, stop)``: those with the batch dim (as many dims as
    their input, ``ndim``, and ``n`` rows, ``n`` > 1). Others go whole: one row broadcasts, and
    an array without the batch dim (a ``feature_mask`` of shape [C, H, W] for [N, C, H, W]
    inputs) is the same for every example, whatever its first dim."""
    if isinstance(value, np.ndarray):
        want = ndim if isinstance(ndim, int) else ndim[0]
        per_example = n > 1 and value.ndim == want and value.shape[0] == n
        return value[start:stop] if per_example else value
    if isinstance(value, tuple):  # one per input
        dims = ndim if isinstance(ndim, tuple) else (ndim,) * len(value)
        if len(dims) != len(value):
            dims = (dims[0],) * len(value)
        return tuple(rows(v, n, d, start, stop) for v, d in zip(value, dims, strict=True))
    if isinstance(value, dict):
        return {k: rows(v, n, ndim, start, stop) for k, v in value.items()}
    return value


def cut_target(target: WireTarget, start: int, stop: int) -> WireTarget:
    """A resolved target cut to examples ``[start, stop)`` (one for all stays whole)."""
    if target is not None and target["form"] in ("per_example", "per_example_tuple"):
        return {**target, "rows": target["rows"][start:stop]}
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
        size = stop - start
        ndim = tuple(a.ndim for a in self.arrays) or (2,)  # token ids from texts: [N, L]
        return dataclasses.replace(
            self,
            arrays=tuple(a[start:stop] for a in self.arrays),
            texts=self.texts[start:stop],
            n=size,
            cost=max(1, self.cost * size // max(1, self.n)),
            key=None,
            **self._cut_fields(ndim, start, stop),
        )

    def _cut_fields(self, ndim: tuple[int, ...], start: int, stop: int) -> dict[str, Any]:
        """A kind of work's own per-example fields cut to ``[start, stop)``."""
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

    @property
    def name(self) -> str:
        return self.method

    def _cut_fields(self, ndim: tuple[int, ...], start: int, stop: int) -> dict[str, Any]:
        baselines = self.baselines
        if not self.shared_baselines:  # else a distribution, sampled
            baselines = rows(baselines, self.n, ndim, start, stop)
        return {
            "target": cut_target(self.target, start, stop),
            "baselines": baselines,
            "params": rows(self.params, self.n, ndim, start, stop),
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


def stack_examples(parts: list[np.ndarray]) -> np.ndarray:
    """Pieces' arrays of examples as one, along dim 0; every later dim padded with zeros to the
    widest piece's. Pieces of texts are tokenized apart, so their token dims differ: past a
    text's end its scores are zero, as in one padded batch."""
    if not parts:
        return np.zeros(0)
    first = parts[0]
    if first.ndim < 2 or all(p.shape[1:] == first.shape[1:] for p in parts):
        return np.concatenate(parts, axis=0)
    if any(p.ndim != first.ndim for p in parts):
        raise ValueError(f"pieces of {sorted({p.ndim for p in parts})} dims cannot be joined")
    widest = [max(p.shape[d] for p in parts) for d in range(1, first.ndim)]
    return np.concatenate(
        [np.pad(p, [(0, 0), *((0, w - s) for w, s in zip(widest, p.shape[1:], strict=True))])
         for p in parts],
        axis=0,
    )  # fmt: skip


def worst(fidelities: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The fidelity of a reply joined from pieces in example order: the per-example delta
    ratios joined, each check's figure at its worst over the pieces (largest error, smallest
    agreement), checked only if every piece was, fallen back if any piece did."""
    given = [f for f in fidelities if f is not None]
    if not given:
        return None
    out = dict(given[0])
    for f in given[1:]:
        ratios = (out.get("delta_ratio"), f.get("delta_ratio"))
        out["delta_ratio"] = None if None in ratios else [*ratios[0], *ratios[1]]  # type: ignore[misc]
        rel = [v for v in (out.get("rel_l2"), f.get("rel_l2")) if v is not None]
        out["rel_l2"] = max(rel) if rel else None
        agree = [v for v in (out.get("topk_agreement"), f.get("topk_agreement")) if v is not None]
        out["topk_agreement"] = min(agree) if agree else None
        out["checked"] = bool(out.get("checked")) and bool(f.get("checked"))
        out["fallback"] = bool(out.get("fallback")) or bool(f.get("fallback"))
        out["tried"] = out.get("tried") or f.get("tried")
        if f.get("precision") != out.get("precision"):  # a piece fell back, another did not
            out["precision"] = "mixed"
    return out


def own_fidelity(fidelity: dict[str, Any] | None, start: int, n: int) -> dict[str, Any] | None:
    """A merged call's fidelity for one request: its own examples' delta ratios."""
    if fidelity is None or fidelity.get("delta_ratio") is None:
        return fidelity
    return {**fidelity, "delta_ratio": fidelity["delta_ratio"][start : start + n]}


#: how a reply's member follows its examples (``Reply``'s fields' ``rows`` metadata)
EXAMPLES = "examples"  # an array, one row (or k rows) per example: cut, stacked
EACH = "each"  # a list of such arrays (one per input or layer), or None
LIST = "list"  # a plain list with one entry per example
SAME = "same"  # the same for every example: the first part's
TIME = "time"  # a duration: shared when cut (a merged call's), summed when joined
FIDELITY = "fidelity"  # per-example delta ratios, the rest at its worst (``worst``)
STUDY = "study"  # a dict whose ``study_rows`` members are lists per example
NONE = "none"  # not carried when cut or joined


def _rows(rule: str, wide: bool = False) -> Any:
    return {"rows": rule, "wide": wide}


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def _member(d: dict[str, Any], name: str) -> tuple[dict[str, Any], str]:
    """The dict holding a dotted member of ``d`` (``"proponents.indices"``), and its key."""
    *path, last = name.split(".")
    for key in path:
        d = d[key]
    return d, last


def _cut_rows(arr: np.ndarray | None, total: int, start: int, n: int) -> np.ndarray | None:
    """Examples ``[start, start + n)`` of an array of ``total`` examples' rows (k rows per
    example, e.g. a delta per sample); one not of whole examples goes whole."""
    if arr is None or arr.ndim == 0 or total == 0 or arr.shape[0] % total:
        return arr
    k = arr.shape[0] // total
    return arr[start * k : (start + n) * k]


def _own_width(a: np.ndarray | None, tokens: list[list[str]] | None, width: int | None) -> Any:
    """Per-token values of merged texts (dim 1 as wide as the merged batch's longest text)
    cut to the part's own longest text: the width it has computed alone."""
    if a is None or tokens is None or a.ndim < 2 or a.shape[1] != width:
        return a
    return a[:, : max((len(t) for t in tokens), default=0)]


def _stacked(arrays: list[np.ndarray | None]) -> np.ndarray | None:
    if any(a is None for a in arrays):
        return None
    first = arrays[0]
    if first is None or first.ndim == 0:
        return first
    return stack_examples(arrays)  # type: ignore[arg-type]


@dataclass
class Reply:
    """A piece of work's answer; ``error`` is ``ServiceError.to_data()`` when it failed.

    A typed result: each field says (its ``rows`` metadata) how it follows the examples, so a
    reply is cut to some of its examples (``cut``: a merged call's share), joined from parts
    (``join``: a split request's pieces, a job's chunks) and stored as arrays and JSON
    (``to_arrays``, ``from_arrays``: a job's chunk files) without anyone listing its fields.
    A new kind of answer adds a field with its rule, or puts plain data in ``study`` and names
    its per-example members in ``study_rows``."""

    work_id: int = field(metadata=_rows(NONE))
    attributions: list[np.ndarray] = field(default_factory=list, metadata=_rows(EACH, True))
    as_tuple: bool = field(default=False, metadata=_rows(SAME))
    #: a list of layers was attributed: how many of ``attributions`` each layer has, in order
    #: (``delta`` is then (N, layers))
    layers: list[int] | None = field(default=None, metadata=_rows(SAME))
    delta: np.ndarray | None = field(default=None, metadata=_rows(EXAMPLES))
    outputs: np.ndarray | None = field(default=None, metadata=_rows(EXAMPLES))
    #: Shapley-family methods: the output at the baselines per example
    base_values: np.ndarray | None = field(default=None, metadata=_rows(EXAMPLES))
    #: sampled Shapley methods: the attributions' standard errors, shaped as they are
    standard_error: list[np.ndarray] | None = field(default=None, metadata=_rows(EACH, True))
    target: list[Any] | None = field(default=None, metadata=_rows(LIST))
    tokens: list[list[str]] | None = field(default=None, metadata=_rows(LIST))
    params: dict[str, Any] = field(default_factory=dict, metadata=_rows(SAME))
    #: the model's whole output per example, when the work asked for it
    predictions: np.ndarray | None = field(default=None, metadata=_rows(EXAMPLES, True))
    compute_ms: float = field(default=0.0, metadata=_rows(TIME))
    merged: int = field(default=1, metadata=_rows(NONE))
    error: dict[str, Any] | None = field(default=None, metadata=_rows(NONE))
    #: causal LMs: input_tokens, output_tokens, seq_attr, token_attr (plain lists)
    generation: dict[str, Any] | None = field(default=None, metadata=_rows(SAME))
    #: ``Attribution.verify``: ``methods.verify``'s figures (``Verification.as_dict``)
    verification: dict[str, Any] | None = field(default=None, metadata=_rows(NONE))
    #: ``Attribution.precision``: what it cost (``Fidelity.as_dict``; pieces: the worst)
    fidelity: dict[str, Any] | None = field(default=None, metadata=_rows(FIDELITY))
    #: an operation's answer as plain data (TCAV's score rows, influence's indices and scores,
    #: an attack's per-example flags)
    study: dict[str, Any] | None = field(default=None, metadata=_rows(STUDY))
    #: the members of ``study`` that are lists with one entry per example (dotted: a list
    #: inside a member, ``"proponents.indices"``)
    study_rows: list[str] | None = field(default=None, metadata=_rows(SAME))
    #: the metrics asked for (``Attribution.metrics``): numpy arrays, curves as
    #: {"auc", "curve"}
    metrics: dict[str, Any] | None = field(default=None, metadata=_rows(NONE))
    #: of ``compute_ms``, the metrics' part
    metrics_ms: float = field(default=0.0, metadata=_rows(NONE))

    def cut(self, work_id: int, start: int, n: int, total: int) -> Reply:
        """Examples ``[start, start + n)`` of this reply of ``total`` examples (a merged
        call's answer, split back per request); per-token values cut to the part's own width."""
        tokens = None if self.tokens is None else self.tokens[start : start + n]
        width = None if self.tokens is None else max((len(t) for t in self.tokens), default=0)
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            rule, wide, value = f.metadata["rows"], f.metadata["wide"], getattr(self, f.name)
            if rule == EACH and value is not None:
                value = [_cut_rows(a, total, start, n) for a in value]
                if wide:
                    value = [_own_width(a, tokens, width) for a in value]
            elif rule == EXAMPLES:
                value = _cut_rows(value, total, start, n)
                if wide:
                    value = _own_width(value, tokens, width)
            elif rule == LIST:
                value = None if value is None else value[start : start + n]
            elif rule == FIDELITY:
                value = own_fidelity(value, start, n)
            elif rule == STUDY:
                value = self._study_cut(start, n)
            elif rule == NONE:
                continue
            out[f.name] = value
        return Reply(work_id=work_id, **out)

    def _study_cut(self, start: int, n: int) -> dict[str, Any] | None:
        if self.study is None or not self.study_rows:
            return self.study
        out = copy.deepcopy(self.study)
        for name in self.study_rows:
            into, key = _member(out, name)
            into[key] = into[key][start : start + n]
        return out

    @classmethod
    def join(cls, work_id: int, parts: list[Reply]) -> Reply:
        """Parts' replies (in example order, none failed) as one: a split request's pieces,
        a job's chunks."""
        first = parts[0]
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            rule, values = f.metadata["rows"], [getattr(p, f.name) for p in parts]
            if rule == EACH:
                out[f.name] = (
                    None
                    if values[0] is None
                    else [_stacked([v[i] for v in values]) for i in range(len(values[0]))]
                )
            elif rule == EXAMPLES:
                out[f.name] = _stacked(values)
            elif rule == LIST:
                out[f.name] = None if values[0] is None else [x for v in values for x in v or []]
            elif rule == SAME:
                out[f.name] = values[0]
            elif rule == TIME:
                out[f.name] = sum(values)
            elif rule == FIDELITY:
                out[f.name] = worst(values)
            elif rule == STUDY:
                out[f.name] = _joined_study(first, values)
        out["merged"] = max(p.merged for p in parts)
        return cls(work_id=work_id, **out)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The reply as a ``.npz``'s arrays: its arrays by name (``attributions_<i>``), the
        rest as JSON in ``meta``."""
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["rows"] == EACH:
                arrays.update({f"{f.name}_{i}": a for i, a in enumerate(value or [])})
            elif f.metadata["rows"] == EXAMPLES:
                if value is not None:
                    arrays[f.name] = value
            elif f.name not in ("work_id", "error"):
                meta[f.name] = value
        arrays["meta"] = np.array(json.dumps(meta, default=_jsonable))
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Reply:
        """``to_arrays``' inverse (and the chunk files of earlier versions: ``convergence_delta``
        for ``delta``, ``per_example`` for ``study_rows``)."""
        meta = json.loads(str(arrays["meta"]))
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            rule = f.metadata["rows"]
            if rule == EACH:
                count = sum(1 for k in arrays if k.startswith(f"{f.name}_"))
                each = [arrays[f"{f.name}_{i}"] for i in range(count)]
                out[f.name] = None if not each and f.default is None else each
            elif rule == EXAMPLES:
                found = arrays.get(f.name)
                if found is None and f.name == "delta":
                    found = arrays.get("convergence_delta")
                out[f.name] = found
            elif f.name in meta:
                out[f.name] = meta[f.name]
        if "study_rows" not in meta and meta.get("per_example") is not None:
            out["study_rows"] = meta["per_example"]
        out.pop("work_id", None)
        return cls(work_id=0, **out)


def _joined_study(first: Reply, studies: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The parts' ``study``: the first's, its per-example members joined over all parts."""
    if studies[0] is None:
        return None
    out = copy.deepcopy(studies[0])
    for name in first.study_rows or ():
        parts = []
        for study in studies:
            held, key = _member(study or {}, name)
            parts.append(held[key])
        into, key = _member(out, name)
        into[key] = [x for part in parts for x in part]
    return out
