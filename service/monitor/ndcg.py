"""Normalized discounted cumulative gain, as scikit-learn's ``ndcg_score([y_true], [y_score])``
computes it for one sample (ties in the scores averaged, logarithmic discount): how well the
live ranking of features by importance keeps the reference's (Clarify's attribution drift
check alarms below 0.9)."""

from __future__ import annotations

import numpy as np


def _dcg(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """DCG of ``y_true`` ranked by ``y_score``, tied scores sharing their gains' mean."""
    discount = 1.0 / np.log2(np.arange(y_true.shape[0]) + 2)
    cumulative = np.cumsum(discount)
    _, inverse, counts = np.unique(-y_score, return_inverse=True, return_counts=True)
    ranked = np.zeros(len(counts))
    np.add.at(ranked, inverse, y_true)
    ranked /= counts
    groups = np.cumsum(counts) - 1
    sums = np.empty(len(counts))
    sums[0] = cumulative[groups[0]]
    sums[1:] = np.diff(cumulative[groups])
    return float((ranked * sums).sum())


def ndcg(reference: np.ndarray, live: np.ndarray) -> float:
    """nDCG of the live scores against the reference's relevances (both >= 0, one per
    feature); 0 where the reference has no gain at all (scikit-learn's convention)."""
    y_true = np.asarray(reference, dtype=np.float64)
    y_score = np.asarray(live, dtype=np.float64)
    ideal = _dcg(y_true, y_true)
    return 0.0 if ideal == 0 else _dcg(y_true, y_score) / ideal
