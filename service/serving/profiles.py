"""Attribution profiles: which features drive a model over many examples, per label, as
SageMaker Clarify's global SHAP and Vertex's mean attributions. A finished job's summary
(``service.summaries``) and a drift monitor's reference and live window (``service.monitor``)
are both read this way.

Each example's attributions are flattened into named features (a row's feature names where
the model declares them, else ``input[i, j]``; one input after the other); examples are
grouped by the label of their target (a ``top_k`` answer counts each of its classes), and
each feature's values over the group are aggregated: ``mean_abs`` (the default), ``mean``,
``median``, ``mean_sq`` or ``std``, ranked largest first. Token models aggregate by token
text: every occurrence of a token (padding left out) is one value of that token's feature,
and ``counts`` says how many there were.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest

AGGREGATES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "mean_abs": lambda v: np.abs(v).mean(axis=0),
    "mean": lambda v: v.mean(axis=0),
    "median": lambda v: np.median(v, axis=0),
    "mean_sq": lambda v: np.square(v).mean(axis=0),
    "std": lambda v: v.std(axis=0),
}
AGGS = tuple(AGGREGATES)


def per_label(rows: np.ndarray, labels: list[str], agg: str) -> dict[str, np.ndarray]:
    """Each label's profile: ``agg`` over its rows of ``rows`` ([n, F]), labels in order of
    first appearance."""
    fn = AGGREGATES[agg]
    return {
        label: fn(rows[[i for i, lb in enumerate(labels) if lb == label]])
        for label in dict.fromkeys(labels)
    }


def label_name(spec: ModelSpec, target: Any) -> str:
    """What a summary calls an example's target: its label, else the class as text, else
    ``"output"`` (a model with one output and no target)."""
    if target is None:
        return "output"
    if isinstance(target, (int, np.integer)) and 0 <= int(target) < len(spec.output.labels):
        return spec.output.labels[int(target)]
    if isinstance(target, dict) and "class" in target:  # a segmentation's region target
        return label_name(spec, target["class"])
    return str(target)


def feature_names(spec: ModelSpec, shapes: list[tuple[int, ...]]) -> list[str]:
    """A name for each scalar of one example's attributions, input after input."""
    names: list[str] = []
    for k, shape in enumerate(shapes):
        given = spec.inputs[k] if k < len(spec.inputs) else None
        if given is not None and given.features and shape == (len(given.features),):
            names.extend(given.features)
            continue
        base = given.name if given is not None else f"input{k}"
        for idx in np.ndindex(*shape):
            names.append(f"{base}[{', '.join(map(str, idx))}]")
    return names


def _rows(body: dict[str, Any]) -> tuple[list[np.ndarray], list[Any], int]:
    """The answer's attributions as one array per input ([N, ...]), one target per attributed
    row, and the rows per example: a top_k answer ([N, K, ...]) is N x K rows, each with its
    class."""
    attrs = body["attributions"]
    parts = [
        np.asarray(a, dtype=np.float64) for a in (attrs if isinstance(attrs, list) else [attrs])
    ]
    if isinstance(body.get("params", {}).get("layer"), list):
        raise InvalidRequest(
            "a summary aggregates one set of attributions per example; this job attributed a "
            "list of layers",
            loc=("path", "job_id"),
        )
    n = parts[0].shape[0]
    targets = list(body.get("target") or [None] * n)
    if targets and all(isinstance(t, list) for t in targets) and parts[0].ndim >= 2:
        k = len(targets[0])
        if all(len(t) == k for t in targets) and parts[0].shape[1] == k:  # top_k
            parts = [p.reshape(n * k, *p.shape[2:]) for p in parts]
            return parts, [c for t in targets for c in t], k
    return parts, targets, 1


def flat_rows(spec: ModelSpec, body: dict[str, Any]) -> tuple[np.ndarray, list[str], list[str]]:
    """An answer's attributions as one flat row per attributed example ([rows, F]), each
    row's label and the features' names (not for token models: their rows differ)."""
    parts, targets, _ = _rows(body)
    flat = np.concatenate([p.reshape(p.shape[0], -1) for p in parts], axis=1)
    names = feature_names(spec, [tuple(p.shape[1:]) for p in parts])
    return flat, [label_name(spec, t) for t in targets], names


def summarize(spec: ModelSpec, body: dict[str, Any], agg: str) -> dict[str, Any]:
    """``{"examples", "agg", "labels": {label: {"examples", "features", "values",
    "ranking"[, "counts"]}}}`` of an attribution job's answer ``body``."""
    fn = AGGREGATES[agg]
    parts, targets, k = _rows(body)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(targets):
        groups[label_name(spec, t)].append(i)
    tokens = body.get("tokens")
    labels: dict[str, Any] = {}
    for name, rows in groups.items():
        if tokens is not None:
            labels[name] = _by_token(parts[0], [tokens[i // k] for i in rows], rows, fn)
            continue
        flat = np.concatenate([p[rows].reshape(len(rows), -1) for p in parts], axis=1)
        values = fn(flat)
        labels[name] = {
            "examples": len(rows),
            "features": feature_names(spec, [tuple(p.shape[1:]) for p in parts]),
            "values": values.tolist(),
            "ranking": _ranking(values),
        }
    return {"examples": len(targets), "agg": agg, "labels": labels}


def _by_token(
    attrs: np.ndarray, tokens: list[list[str]], rows: list[int], fn: Callable[..., np.ndarray]
) -> dict[str, Any]:
    """A token model's label: each token text's occurrences aggregated (``tokens``: each
    row's; one score per token: dims past the tokens', an embedding's, summed)."""
    scores = attrs.reshape(attrs.shape[0], attrs.shape[1], -1).sum(axis=2)
    seen: dict[str, list[float]] = defaultdict(list)
    for i, row in zip(rows, tokens, strict=True):
        for j, text in enumerate(row[: scores.shape[1]]):
            seen[text].append(float(scores[i, j]))
    features = list(seen)
    values = np.array([float(fn(np.asarray(seen[t]))) for t in features])
    return {
        "examples": len(rows),
        "features": features,
        "values": values.tolist(),
        "ranking": _ranking(values),
        "counts": [len(seen[t]) for t in features],
    }


def _ranking(values: np.ndarray) -> list[int]:
    """Feature indices, largest value first (ties: the earlier feature first)."""
    return [int(i) for i in np.argsort(-values, kind="stable")]
