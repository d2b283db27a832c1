"""Captum's ``SimilarityInfluence`` metrics on flattened layer activations."""

from __future__ import annotations

import torch
from torch import Tensor


def cosine(test: Tensor, train: Tensor, replace_nan: float) -> Tensor:
    """Captum's ``cosine_similarity``: rows scaled to unit norm; a zero row is replaced by a
    row of ``replace_nan`` (-2 when looking for the most similar, 2 for the least)."""
    fill = torch.tensor(replace_nan, dtype=test.dtype, device=test.device)
    test_norm = torch.linalg.norm(test, ord=2, dim=1, keepdim=True)
    train_norm = torch.linalg.norm(train, ord=2, dim=1, keepdim=True)
    test = torch.where(test_norm != 0.0, test / test_norm, fill)
    train = torch.where(train_norm != 0.0, train / train_norm, fill)
    return torch.mm(test, train.T)


def euclidean(test: Tensor, train: Tensor) -> Tensor:
    """Captum's ``euclidean_distance`` (``torch.cdist``), computed without the matrix-product
    shortcut so the distances do not depend on how many rows are compared at once."""
    return torch.cdist(
        test.unsqueeze(0), train.unsqueeze(0), compute_mode="donot_use_mm_for_euclid_dist"
    ).squeeze(0)


def scores(similarity: str, test: Tensor, train: Tensor, proponents: bool) -> Tensor:
    """(n_test, n_train) similarities: cosine (higher is more similar) or euclidean distance
    (lower is more similar). Cosine's zero-row fill follows the direction, as Captum's
    ``similarity_direction`` sets it."""
    if similarity == "cosine":
        return cosine(test, train, -2.0 if proponents else 2.0)
    return euclidean(test, train)


def largest_first(similarity: str, proponents: bool) -> bool:
    """Whether the top ``k`` are the largest scores: the most similar (proponents) are the
    highest cosines but the smallest distances."""
    return proponents if similarity == "cosine" else not proponents
