"""A piece of work's answer (``Reply``): a typed result whose fields say how they follow the
examples, so the pool, the worker's merge and the job store cut, join and store any operation's
answer without listing its fields."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    #: a segmentation target's region per example (N, H, W; true inside), which pictures
    #: outline
    regions: np.ndarray | None = field(default=None, metadata=_rows(EXAMPLES))
    #: the image regions the answer credits, one [N, H, W] map per image input: the method's
    #: own (XRAI's regions numbered by rank, 1 the most important)
    segments: list[np.ndarray] | None = field(default=None, metadata=_rows(EACH))
    #: text units (``Attribution.units``): per example, each unit's text and character offsets
    units: list[list[dict[str, Any]]] | None = field(default=None, metadata=_rows(LIST))
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
