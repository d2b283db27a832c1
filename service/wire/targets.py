"""Targets: the one home of what a target means, from the JSON a request sends to the value of
the model's output the worker attributes.

- server: every JSON form the API takes, resolved against the model's output (``resolve``);
- pool: written one entry per example (``per_example``), concatenated for merged jobs
  (``concat``), compared for merging (``form``);
- worker: predicted classes filled in (``of_predictions``), the engine's form (``to_engine``),
  the output at the target (``select``), and the per-example echo of the response (``rows``).

The resolved form is plain data that crosses the process boundary:
``None`` | ``{"form": "index", "index": [...]}`` | ``{"form": "per_example", "rows": [...]}`` |
``{"form": "per_example_tuple", "rows": [[...], ...]}`` | ``{"form": "predicted"}`` |
``{"form": "region", ...}`` (``service.wire.regions``) | ``{"form": "box", ...}``
(``service.wire.boxes``).
"""

from __future__ import annotations

from typing import Any

import torch

from model_registry.spec import OutputSpec
from service.core.errors import InvalidRequest, Loc
from service.core.work import WireTarget
from service.wire import boxes, regions

LOC: Loc = ("body", "target")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _label(v: str, out: OutputSpec, loc: Loc) -> int:
    if not out.labels:
        raise InvalidRequest(f"this model has no labels; {v!r} is not a target", loc=loc)
    if v not in out.labels:
        raise InvalidRequest(f"unknown label {v!r}; the labels are {list(out.labels)}", loc=loc)
    return out.labels.index(v)


def _class(v: object, out: OutputSpec, loc: Loc) -> int:
    """One class index (an int or a label name) on a 1-D-per-example output, range-checked."""
    if isinstance(v, str):
        if len(out.shape) > 1:
            raise InvalidRequest(
                f"the model gives a label per position ({list(out.shape)} per example): a "
                'target is [position, label] per example, e.g. [[3, "PER"]]',
                loc=loc,
            )
        return _label(v, out, loc)
    if not _is_int(v):
        raise InvalidRequest(f"a target must be an int or a label, got {v!r}", loc=loc)
    _check_index([v], out, loc)
    return int(v)  # type: ignore[call-overload]


def _check_index(index: list[Any], out: OutputSpec, loc: Loc) -> None:
    if not index or not all(_is_int(i) for i in index):
        raise InvalidRequest(
            f"a target index must be a non-empty list of ints, got {index}", loc=loc
        )
    if len(index) > len(out.shape):
        raise InvalidRequest(
            f"target {index} has {len(index)} indices; the model output per example has "
            f"shape {list(out.shape)}",
            loc=loc,
        )
    for d, i in enumerate(index):
        size = out.shape[d]
        # below 0 is refused (CONTRACT 9.1), not counted from the end as Python and the engine
        # do: a client's -1 is more often a "no class" sentinel than a wish for the last class
        if i < 0 or (size is not None and i >= size):
            what = "indices from 0" if size is None else f"classes 0..{size - 1}"
            what += f" or {list(out.labels)}" if out.labels else ""
            of_size = "" if size is None else f" of size {size}"
            why = "; a target counts from 0, never from the end" if i < 0 else ""
            raise InvalidRequest(
                f"target {i} is out of range for output dim {d + 1}{of_size} ({what}){why}",
                loc=loc,
            )


def _scalar_output(out: OutputSpec) -> bool:
    return all(d == 1 for d in out.shape)


def resolve(raw: Any, out: OutputSpec, n: int, names: str = "classes") -> WireTarget:
    """Validate the JSON ``target`` for ``n`` examples and return its wire form; ``names``:
    what a target names on the model's task (``Task.targets``): classes, none (a
    regression), a region of a segmentation output, an answer's start, end or span."""
    if names == "none":
        if raw is not None:
            raise InvalidRequest(
                "a regression model predicts one value per example: there is no target to "
                "choose; send no target",
                loc=LOC,
            )
        return None
    if names == "region":
        return regions.resolve(raw, out, n)
    if names == "box":
        return boxes.resolve(raw, out, n)
    if names == "answer":
        if raw is None:
            raw = "span"
        if raw == "predicted" or isinstance(raw, dict):
            raise InvalidRequest(
                f'an answer\'s target is "start", "end" or "span" (their sum; the default), or '
                f"one per example; got {raw!r}",
                loc=LOC,
            )
    if raw is None:
        if not _scalar_output(out):
            raise InvalidRequest(
                f"target is required: the model gives {list(out.shape)} values per example; "
                'pass a class (int or label), one per example, {"index": [...]} or "predicted"',
                loc=LOC,
            )
        return None
    if raw == "predicted":
        if len(out.shape) != 1:
            raise InvalidRequest('"predicted" needs a model with 1-D outputs (classes)', loc=LOC)
        return {"form": "predicted"}
    if _is_int(raw) or isinstance(raw, str):
        return {"form": "index", "index": [_class(raw, out, LOC)]}
    if isinstance(raw, dict) and "top_k" in raw:
        return _top_k(raw, out)
    if isinstance(raw, dict):
        return {"form": "index", "index": _index_obj(raw, out, LOC)}
    if isinstance(raw, list):
        if len(raw) != n:
            raise InvalidRequest(
                f"a list target needs one entry per example: got {len(raw)} for {n} examples",
                loc=LOC,
            )
        if len(out.shape) == 2 and out.labels and all(isinstance(t, list) for t in raw):
            # a label per position (token classifiers): [position, label] per example
            return {"form": "per_example_tuple",
                    "rows": [_position(t, out, (*LOC, i)) for i, t in enumerate(raw)]}  # fmt: skip
        if all(isinstance(t, dict) for t in raw):
            rows = [_index_obj(t, out, (*LOC, i)) for i, t in enumerate(raw)]
            if len({len(r) for r in rows}) != 1:
                raise InvalidRequest("per-example index targets must have the same length", loc=LOC)
            return {"form": "per_example_tuple", "rows": rows}
        classes = [_class(t, out, (*LOC, i)) for i, t in enumerate(raw)]
        return {"form": "per_example", "rows": classes}
    raise InvalidRequest(f"unsupported target {raw!r}", loc=LOC)


def _position(raw: list[Any], out: OutputSpec, loc: Loc) -> list[int]:
    """``[position, label]`` (an int or a label name) of a model with a label per position."""
    if len(raw) != 2 or not _is_int(raw[0]) or not (_is_int(raw[1]) or isinstance(raw[1], str)):
        raise InvalidRequest(
            f'a target per example is [position, label], e.g. [3, "PER"]; got {raw!r}', loc=loc
        )
    label = _label(raw[1], out, loc) if isinstance(raw[1], str) else int(raw[1])
    _check_index([int(raw[0]), label], out, loc)
    return [int(raw[0]), label]


def _top_k(raw: dict[str, Any], out: OutputSpec) -> WireTarget:
    """``{"top_k": K}``: each example's K best classes, chosen in the worker."""
    k: Any = raw.get("top_k")
    if set(raw) != {"top_k"} or not _is_int(k) or k < 1:
        raise InvalidRequest('a top_k target is {"top_k": K} with K >= 1', loc=(*LOC, "top_k"))
    if len(out.shape) != 1:
        raise InvalidRequest(
            f"top_k ranks classes: it needs a model with one score per class (1-D outputs); "
            f"this model gives {list(out.shape)} per example",
            loc=(*LOC, "top_k"),
        )
    classes = out.shape[0]
    if classes is not None and k > classes:
        raise InvalidRequest(
            f"top_k is {k} but the model has {classes} classes", loc=(*LOC, "top_k")
        )
    return {"form": "top_k", "k": int(k)}


def _index_obj(raw: dict[str, Any], out: OutputSpec, loc: Loc) -> list[int]:
    index = raw.get("index")
    if set(raw) != {"index"} or not isinstance(index, list):
        raise InvalidRequest('an index target is {"index": [i, j, ...]}', loc=loc)
    _check_index(index, out, loc)
    return [int(i) for i in index]


def to_engine(t: WireTarget) -> Any:
    """The engine's form of a resolved wire target ("predicted" must be resolved first)."""
    if t is None:
        return None
    form = t["form"]
    if form == "index":
        idx = t["index"]
        return idx[0] if len(idx) == 1 else tuple(idx)
    if form == "per_example":
        return list(t["rows"])
    if form == "per_example_tuple":
        return [tuple(r) for r in t["rows"]]
    if form == "top_k":
        return {"top_k": t["k"]}
    if form == "region":
        return regions.to_engine(t)
    raise ValueError(f"unresolved target {t}")


def per_example(t: WireTarget, n: int) -> WireTarget:
    """The same target written one entry per example (what merged batches concatenate)."""
    if t is None or t["form"] in ("per_example", "per_example_tuple", "predicted", "top_k",
                                  "region", "box"):  # fmt: skip
        return t
    idx = t["index"]
    if len(idx) == 1:
        return {"form": "per_example", "rows": [idx[0]] * n}
    return {"form": "per_example_tuple", "rows": [list(idx)] * n}


def predicted(t: WireTarget) -> bool:
    """Whether the target is each example's predicted class (known after a forward)."""
    return t is not None and t["form"] == "predicted"


def of_predictions(out: torch.Tensor) -> WireTarget:
    """``"predicted"`` resolved: each example's argmax class."""
    return {"form": "per_example", "rows": out.argmax(dim=-1).tolist()}


def concat(parts: list[tuple[WireTarget, int]]) -> WireTarget:
    """The targets of jobs merged into one (``(target, examples)`` each, same form)."""
    first = parts[0][0]
    if first is None or first["form"] in ("predicted", "top_k"):  # the same for every example
        return first
    if first["form"] == "region":
        return regions.concat([t for t, _ in parts])
    if first["form"] == "box":  # one threshold (``form``): the rows joined
        return {**first, "rows": [r for t, _ in parts if t is not None for r in t["rows"]]}
    written = [per_example(t, n) for t, n in parts]
    rows = [r for w in written if w is not None for r in w["rows"]]
    return {"form": written[0]["form"] if written[0] else "per_example", "rows": rows}


def form(t: WireTarget) -> Any:
    """What must be equal for two jobs' targets to merge: a class each, or index tuples of
    one length."""
    if t is None:
        return None
    if t["form"] in ("index", "per_example"):
        return "class" if t["form"] == "per_example" or len(t["index"]) == 1 else len(t["index"])
    if t["form"] == "per_example_tuple":
        return len(t["rows"][0])
    if t["form"] == "top_k":
        return ("top_k", t["k"])
    if t["form"] == "region":
        return regions.form(t)
    if t["form"] == "box":
        return ("box", t["iou_threshold"])
    return t["form"]


def rows(t: WireTarget, n: int) -> list[Any] | None:
    """The target of each of ``n`` examples, as the response echoes it."""
    if t is None:
        return None
    if t["form"] == "index":
        idx = t["index"]
        return [idx[0] if len(idx) == 1 else list(idx)] * n
    return list(t["rows"])


def select(out: torch.Tensor, target: Any, n: int) -> torch.Tensor:
    """The model output at the engine target, one value per example."""
    if target is None:
        return out.reshape(n, -1)[:, 0]
    if isinstance(target, dict) and "region" in target:
        return regions.select(out, target)
    if isinstance(target, int):
        return out[:, target]
    if isinstance(target, tuple):
        return out[(slice(None), *target)]
    chosen = torch.tensor(target, device=out.device)
    ar = torch.arange(n, device=out.device)
    if chosen.dim() == 1:
        return out[ar, chosen]
    return out[(ar, *chosen.unbind(1))]
