"""Coalitions of features: evaluating them once each, and the Shapley value formulas over them.

A coalition is a boolean vector over features (True: the feature keeps its input value, False:
it takes its baseline). Shapley sampling, exact Shapley values, Kernel SHAP and LIME all reduce
to "evaluate the model on many coalitions, then combine": this module evaluates each distinct
coalition once (permutation prefixes repeat a lot) in as few batched forwards as allowed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine.inputs import Tensors
from methods.engine.masks import FeatureMasks, coalition_inputs
from methods.engine.perturb import Evaluator

#: exact Shapley values evaluate all 2**F coalitions; beyond this many features, refuse
MAX_EXACT_FEATURES = 16

#: bits per int64 word when coalitions are packed for sorting (the sign bit stays clear)
_WORD_BITS = 62

PerRow = Callable[[Tensors, int], Tensor]


def evaluate(
    ev: Evaluator,
    masks: FeatureMasks,
    keep: Tensor,
    on: Tensors,
    off: Tensors,
    per_row: PerRow | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Outputs for coalitions ``keep`` (P, 1 or N, F), shape (P, *out_shape), each distinct
    coalition evaluated once; plus ``per_row(inputs, k)`` values (P, ...) if given."""
    p = int(keep.shape[0])
    uniq, inverse = distinct_rows(keep.reshape(p, -1))
    distinct = uniq.reshape(-1, *keep.shape[1:])
    extra: list[Tensor] = []

    def build(s: int, e: int) -> Tensors:
        return coalition_inputs(masks, distinct[s:e], on, off)

    def inspect(s: int, e: int, inputs: Tensors) -> None:
        if per_row is not None:
            extra.append(per_row(inputs, e - s))

    values = ev.run(int(distinct.shape[0]), build, inspect if per_row is not None else None)
    rows = torch.cat(extra)[inverse] if per_row is not None else None
    return values[inverse], rows


def distinct_rows(flat: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.unique(flat, dim=0, return_inverse=True)`` for a bool matrix, in the same order.

    ``unique(dim=0)`` compares rows element by element and costs milliseconds for a few
    hundred coalitions (more than the forwards of a small model). Rows are packed into int64
    words instead, the first column most significant, so that sorting the words as numbers
    (stable, last word first) gives the same lexicographic order, hence the same chunks and
    bit-identical outputs.
    """
    p, width = flat.shape
    dev = flat.device
    words = []
    for s in range(0, max(width, 1), _WORD_BITS):
        checkpoint()  # wide coalitions (thousands of features) take a while to pack and sort
        bits = flat[:, s : s + _WORD_BITS].long()
        shifts = torch.arange(int(bits.shape[1]) - 1, -1, -1, device=dev)
        words.append((bits << shifts).sum(1))
    if len(words) == 1:
        keys, inverse = torch.unique(words[0], sorted=True, return_inverse=True)
        return (keys.unsqueeze(1) >> shifts) & 1 == 1, inverse
    order = torch.sort(words[-1], stable=True).indices
    for word in reversed(words[:-1]):
        checkpoint()
        order = order[torch.sort(word[order], stable=True).indices]
    ranked = torch.stack(words, 1)[order]
    first = torch.ones(p, dtype=torch.bool, device=dev)  # first row of each run of equal rows
    first[1:] = (ranked[1:] != ranked[:-1]).any(1)
    group = first.cumsum(0) - 1
    return flat[order[first]], torch.empty_like(group).scatter_(0, order, group)


def all_coalitions(n_features: int, device: torch.device) -> Tensor:
    """Every coalition as bool (2**F, F); row c holds the bits of c."""
    codes = torch.arange(1 << n_features, device=device)
    return ((codes.unsqueeze(1) >> torch.arange(n_features, device=device)) & 1).bool()


def exact_shapley_matrix(coalitions: Tensor, dtype: torch.dtype) -> Tensor:
    """A (F, 2**F) with phi = A @ v: phi_i = sum over S not holding i of
    |S|! (F-|S|-1)! / F! * (v(S + i) - v(S)) (Shapley 1953)."""
    f = int(coalitions.shape[1])
    sizes = coalitions.sum(1)
    w = torch.tensor(
        [1.0 / (f * math.comb(f - 1, s)) for s in range(f)], dtype=dtype, device=coalitions.device
    )
    with_i = w[(sizes - 1).clamp(min=0)]
    without_i = w[sizes.clamp(max=f - 1)]
    return torch.where(coalitions.t(), with_i.unsqueeze(0), -without_i.unsqueeze(0))


def permutation_prefixes(perms: Tensor) -> Tensor:
    """For permutations (S, F): the coalitions after each step, bool (S, F + 1, F), step 0
    empty and step F full."""
    f = int(perms.shape[1])
    rank = torch.argsort(perms, dim=1)  # rank[s, i]: position of feature i in permutation s
    steps = torch.arange(f + 1, device=perms.device).view(1, f + 1, 1)
    return rank.unsqueeze(1) < steps


def contributions(perms: Tensor, values: Tensor) -> Tensor:
    """Each permutation's marginal contribution of each feature: values (S, F + 1, *out)
    along each permutation (S, F); returns (S, F, *out) (every feature once per permutation)."""
    s, f = perms.shape
    diffs = values[:, 1:] - values[:, :-1]
    out = torch.zeros((s, f, *values.shape[2:]), dtype=values.dtype, device=values.device)
    index = perms.reshape(s, f, *(1,) * (values.dim() - 2)).expand_as(diffs)
    return out.scatter_(1, index, diffs)


def credit_permutations(perms: Tensor, values: Tensor) -> Tensor:
    """Mean marginal contribution per feature: values (S, F + 1, *out) along each permutation
    (S, F); returns (F, *out). Sums telescope, so efficiency holds to rounding."""
    s, f = perms.shape
    diffs = values[:, 1:] - values[:, :-1]
    out = torch.zeros((f, *values.shape[2:]), dtype=values.dtype, device=values.device)
    out.index_add_(0, perms.reshape(-1), diffs.reshape(s * f, *values.shape[2:]))
    return out / s


def within_tolerance(phi: Tensor, se: Tensor, tolerance: float) -> bool:
    """Whether every example's (dim 1 of (F, N, ...)) largest SE is within ``tolerance``
    times its largest |attribution| (an all-zero answer has nothing left to estimate)."""
    n = int(phi.shape[1])
    top = phi.abs().transpose(0, 1).reshape(n, -1).amax(1)
    worst = se.transpose(0, 1).reshape(n, -1).amax(1)
    return bool((worst <= tolerance * top).all())
