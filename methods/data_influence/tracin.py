"""The one-shot calls: ``influence`` and ``self_influence``.

TracInCP and TracInCPFast stream over the training set: for each checkpoint the test side is
computed once, then the training set chunk by chunk (``batch_size`` examples), so at most one
chunk's per-example gradients exist at a time. The random-projection and similarity methods
build an index (what Captum keeps too) and answer from it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from methods.data_influence.common import METHODS, InfluenceResult, check_choice, top_k
from methods.data_influence.features import (
    Extractor,
    data,
    dot,
    make_setup,
    self_dot,
    states,
)
from methods.data_influence.index import answer, build, check_k, check_proponents
from methods.errors import InvalidArgumentError


def influence(
    model: Any,
    train_inputs: Tensor | tuple[Tensor, ...],
    train_labels: Tensor | None,
    inputs: Tensor | tuple[Tensor, ...],
    labels: Tensor | None,
    *,
    method: str = "tracin_cp",
    checkpoints: list[Any] | None = None,
    loss: str = "cross_entropy",
    layers: str | list[str] | None = None,
    k: int | None = None,
    proponents: bool = True,
    batch_size: int | None = None,
    projection_dim: int | None = None,
    seed: int | None = None,
    similarity: str = "cosine",
) -> InfluenceResult:
    """Influence of each training example on each test example: ``scores`` (n_test, n_train),
    or with ``k`` the ``k`` proponents (highest scores, descending) or opponents (lowest,
    ascending) of each test example and their training ``indices``. For similarity the
    most similar are the highest cosines or the smallest euclidean distances."""
    s = make_setup(
        model,
        method=method,
        checkpoints=checkpoints,
        loss=loss,
        layers=layers,
        batch_size=batch_size,
        projection_dim=projection_dim,
        seed=seed,
        similarity=similarity,
    )
    train_xs, train_y = data(s.method, train_inputs, train_labels, "train_inputs", "train_labels")
    xs, y = data(s.method, inputs, labels, "inputs", "labels")
    k = check_k(k, train_xs[0].shape[0])
    proponents = check_proponents(proponents)
    if s.method in ("tracin_cp_fast_rand_proj", "similarity"):
        index = build(s, train_xs, train_y, None)
        return answer(index, s, xs, y, k, proponents, verify=False)
    ext = Extractor(s)
    parts: list[Tensor] = []
    for c, (lr, state) in enumerate(states(s)):
        test = ext.whole(state, xs, y)
        for i, (_, _, train) in enumerate(ext.chunked(state, train_xs, train_y)):
            contribution = dot(s.method, test, train) * lr
            if c == 0:
                parts.append(contribution)
            else:
                parts[i] = parts[i] + contribution
    scores = torch.cat(parts, dim=1)
    return InfluenceResult(scores) if k is None else top_k(scores, k, proponents)


def self_influence(
    model: Any,
    train_inputs: Tensor | tuple[Tensor, ...],
    train_labels: Tensor | None,
    *,
    method: str = "tracin_cp",
    checkpoints: list[Any] | None = None,
    loss: str = "cross_entropy",
    layers: str | list[str] | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
) -> Tensor:
    """Each training example's influence on itself (n_train,): the sum over checkpoints of
    lr * |gradient|^2 (tracin_cp_fast: lr * |output gradient|^2 * |layer input|^2)."""
    name = check_choice(method, METHODS, "method")
    if name not in ("tracin_cp", "tracin_cp_fast"):
        raise InvalidArgumentError(
            f"self influence is not defined for {name} (Captum raises NotImplementedError "
            "for TracInCPFastRandProj); use tracin_cp or tracin_cp_fast",
            argument="method",
        )
    s = make_setup(
        model,
        method=name,
        checkpoints=checkpoints,
        loss=loss,
        layers=layers,
        batch_size=batch_size,
        seed=seed,
    )
    xs, y = data(s.method, train_inputs, train_labels, "train_inputs", "train_labels")
    ext = Extractor(s)
    parts: list[Tensor] = []
    for c, (lr, state) in enumerate(states(s)):
        for i, (_, _, train) in enumerate(ext.chunked(state, xs, y)):
            contribution = self_dot(s.method, train) * lr
            if c == 0:
                parts.append(contribution)
            else:
                parts[i] = parts[i] + contribution
    return torch.cat(parts, dim=0)
