"""Feature hierarchies for Owen values (``partition``): binary trees over the features.

A tree is a linkage matrix as scipy writes one (and shap reads one): row ``k`` merges nodes
``Z[k, 0]`` and ``Z[k, 1]`` (a leaf ``j < M`` is feature ``j``; node ``M + k`` is row ``k``) at
height ``Z[k, 2]``, holding ``Z[k, 3]`` leaves. Where the trees come from, as shap builds them:

- ``axis_splits``: an array split in halves along its longest axis, then the next (shap's
  ``Image`` masker over ``(H, W, C)``; over ``(F, 1, 1)`` the balanced tree of a feature row);
- ``correlation_tree``: single linkage over 1 - the Pearson correlation between the background
  set's columns (``shap.maskers.Partition(data, clustering="correlation")``);
- ``text_tree``: tokens joined pieces of words first, then words, then across punctuation
  (``shap.maskers.Text``'s heuristic), from the tokens' text.

``Tree`` adds what the Owen recursion needs: each node's leaves as one contiguous range of a
leaf order, and each node's size.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from methods.errors import InvalidArgumentError


@dataclass(frozen=True)
class Tree:
    """A checked linkage over ``leaves`` features, with each node's leaves a range of
    ``order``: node ``i`` holds features ``order[start[i]:end[i]]``."""

    linkage: np.ndarray
    leaves: int
    order: np.ndarray
    start: np.ndarray
    end: np.ndarray

    @property
    def root(self) -> int:
        return 2 * self.leaves - 2

    def children(self, node: int) -> tuple[int, int]:
        row = self.linkage[node - self.leaves]
        return int(row[0]), int(row[1])

    def size(self, node: int) -> int:
        return 1 if node < self.leaves else int(self.end[node] - self.start[node])


def tree(linkage: np.ndarray | Sequence[Sequence[float]], leaves: int, what: str) -> Tree:
    """``linkage`` checked as a binary tree over ``leaves`` features (``what`` names it in
    errors), with its leaf ranges."""
    z = np.asarray(linkage, dtype=np.float64)
    if leaves == 1 and z.size == 0:
        z = z.reshape(0, 4)
    if z.ndim != 2 or z.shape[1] < 2 or z.shape[0] != leaves - 1:
        raise InvalidArgumentError(
            f"partition: {what} must be a linkage matrix of shape ({leaves - 1}, 4) for "
            f"{leaves} features (scipy.cluster.hierarchy's form), got {tuple(z.shape)}",
            argument="clustering",
        )
    if not np.isfinite(z[:, :2]).all() or (z[:, :2] != np.round(z[:, :2])).any():
        raise InvalidArgumentError(
            f"partition: {what}'s first two columns must be node indices (integers)",
            argument="clustering",
        )
    m = leaves
    start = np.zeros(2 * m - 1, dtype=np.int64)
    end = np.zeros(2 * m - 1, dtype=np.int64)
    used = np.zeros(2 * m - 1, dtype=bool)
    for k in range(m - 1):
        for c in (int(z[k, 0]), int(z[k, 1])):
            if c < 0 or c >= m + k or used[c]:
                raise InvalidArgumentError(
                    f"partition: {what} row {k} merges node {c}, which is not a leaf or an "
                    f"earlier row's node, or is merged twice; a row may join leaves 0..{m - 1} "
                    "and the nodes of the rows before it, each once",
                    argument="clustering",
                )
            used[c] = True
    order = np.empty(m, dtype=np.int64)
    pos = 0
    stack = [(2 * m - 2, False)]
    while stack:  # depth first, left child first: each node's leaves are contiguous
        node, done = stack.pop()
        if node < m:
            order[pos], start[node], end[node] = node, pos, pos + 1
            pos += 1
            continue
        left, right = int(z[node - m, 0]), int(z[node - m, 1])
        if done:
            start[node], end[node] = start[left], end[right]
            continue
        stack += [(node, True), (right, False), (left, False)]
    full = np.zeros((m - 1, 4), dtype=np.float64)
    full[:, : min(4, z.shape[1])] = z[:, :4]
    if z.shape[1] < 3:
        full[:, 2] = 1.0  # no heights: every node may be split
    full[:, 3] = (end - start)[m:]
    return Tree(full, m, order, start, end)


@lru_cache(maxsize=16)
def axis_tree(shape: tuple[int, int, int]) -> Tree:
    """``axis_splits(shape)`` as a checked ``Tree``, cached per shape (an image of 224 px has
    150528 leaves: building and checking its tree takes a second). Never modify it."""
    return tree(_axis_splits(tuple(int(s) for s in shape)), math.prod(shape), "the axis splits")


def axis_splits(shape: tuple[int, int, int]) -> np.ndarray:
    """The linkage splitting an ``(X, Y, Z)`` array in halves along x while it is the widest
    (at least as wide as y), else along y, and along z once x and y are single, the larger
    parts split first; leaf ``x * Y * Z + y * Z + z`` (shap's ``Image`` masker's partition
    tree, heights 0). Cached per shape."""
    return _axis_splits(tuple(int(s) for s in shape)).copy()


@lru_cache(maxsize=16)
def _axis_splits(shape: tuple[int, int, int]) -> np.ndarray:
    xw, yw, zw = shape
    m = xw * yw * zw
    z = np.zeros((max(m - 1, 0), 4), dtype=np.float64)
    q: list[tuple[int, int, int, int, int, int, int, int, bool]] = [
        (0, 0, xw, 0, yw, 0, zw, -1, False)
    ]
    ind = m - 2
    while q:
        _, x0, x1, y0, y1, z0, z1, parent, is_left = heapq.heappop(q)
        if parent >= 0:  # a leaf's id (ind + m < m) is its position, channels last
            z[parent, 0 if is_left else 1] = ind + m
        if (x1 - x0, y1 - y0, z1 - z0) != (1, 1, 1):
            lx1, rx0, ly1, ry0, lz1, rz0 = x1, x0, y1, y0, z1, z0
            if x1 - x0 >= y1 - y0 and x1 - x0 > 1:
                lx1 = rx0 = x0 + (x1 - x0) // 2
            elif y1 - y0 > 1:
                ly1 = ry0 = y0 + (y1 - y0) // 2
            else:
                lz1 = rz0 = z0 + (z1 - z0) // 2
            lsize = (lx1 - x0) * (ly1 - y0) * (lz1 - z0)
            rsize = (x1 - rx0) * (y1 - ry0) * (z1 - rz0)
            heapq.heappush(q, (-lsize, x0, lx1, y0, ly1, z0, lz1, ind, True))
            heapq.heappush(q, (-rsize, rx0, x1, ry0, y1, rz0, z1, ind, False))
        ind -= 1
    for k in range(m - 1):  # children have lower indices than their parents
        left, right = int(z[k, 0]), int(z[k, 1])
        z[k, 3] = (1 if left < m else z[left - m, 3]) + (1 if right < m else z[right - m, 3])
    return z


def correlation_tree(rows: torch.Tensor) -> np.ndarray:
    """Single linkage over the correlation distance (1 - Pearson correlation) between the
    columns of ``rows`` (B, F), as ``shap.maskers.Partition(rows, clustering="correlation")``
    builds it (a constant column is at distance 1 from every other)."""
    x = rows.detach().to(torch.float64).cpu().numpy()
    if x.shape[0] < 2:
        raise InvalidArgumentError(
            'partition: clustering "correlation" needs a background set of at least 2 rows '
            "to correlate the features over",
            argument="clustering",
        )
    c = x - x.mean(0)
    norm = np.sqrt((c * c).sum(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (c.T @ c) / np.outer(norm, norm)
    dist = np.where(np.isfinite(corr), 1.0 - corr, 1.0)
    return single_linkage(np.clip(dist, 0.0, 2.0))


def single_linkage(dist: np.ndarray) -> np.ndarray:
    """scipy's ``single`` linkage of a square distance matrix: the minimum spanning tree's
    edges in increasing length, each joining the two clusters it connects (smaller id first)."""
    m = dist.shape[0]
    z = np.zeros((max(m - 1, 0), 4), dtype=np.float64)
    if m < 2:
        return z
    # Prim's algorithm on the dense matrix, then the edges sorted (stable) by length
    inside = np.zeros(m, dtype=bool)
    best = np.full(m, np.inf)
    parent = np.zeros(m, dtype=np.int64)
    inside[0] = True
    best[:] = dist[0]
    edges = []
    for _ in range(m - 1):
        cand = np.where(inside, np.inf, best)
        j = int(np.argmin(cand))
        edges.append((float(cand[j]), int(parent[j]), j))
        inside[j] = True
        closer = dist[j] < best
        best = np.where(closer, dist[j], best)
        parent = np.where(closer, j, parent)
    edges.sort(key=lambda e: e[0])
    root = list(range(m))
    node_of = list(range(m))  # the cluster node holding each union-find root
    size = [1] * m

    def find(a: int) -> int:
        while root[a] != a:
            root[a] = root[root[a]]
            a = root[a]
        return a

    for k, (d, a, b) in enumerate(edges):
        ra, rb = find(a), find(b)
        na, nb = node_of[ra], node_of[rb]
        z[k] = (min(na, nb), max(na, nb), d, size[ra] + size[rb])
        root[rb] = ra
        size[ra] += size[rb]
        node_of[ra] = m + k
    return z


# --- text: shap.maskers.Text's token hierarchy ------------------------------------------------

_OPENERS = {"(": ")"}
_CLOSERS = {")": "("}
_CONNECTORS = ("but", "and", "or")
_SPACE_END = re.compile(r"^.*\W$")
_LETTER_START = re.compile(r"^[A-Za-z]")


def text_tree(segments: Sequence[str], special_tokens: Sequence[str] = ()) -> np.ndarray:
    """The linkage shap's ``Text`` masker builds over a text's tokens, from each token's
    segment of the text (its characters up to the next token's): a piece glued to the one
    before it (a letter after a non-space) is a word's continuation and joins first, then
    apostrophe endings, then words, reaching across connectors, commas and sentence ends
    last; ``special_tokens`` (the separator) join last. Heights are the nodes' sizes over the
    largest (shap's rescaling)."""
    tokens: list[str] = []
    for i, v in enumerate(segments):
        glued = (
            i > 0
            and _SPACE_END.match(segments[i - 1]) is None
            and _LETTER_START.match(v) is not None
            and tokens[i - 1] != ""
        )
        tokens.append("##" + v.strip() if glued else v.strip())
    z = _merge_tokens(tokens, list(special_tokens))
    if len(z):
        z[:, 2] = z[:, 3] / z[:, 3].max()
    return z


class _Group:
    __slots__ = ("balanced", "index", "tokens")

    def __init__(self, tokens: list[str], balanced: list[bool], index: int) -> None:
        self.tokens, self.balanced, self.index = tokens, balanced, index


def _score(g1: _Group, g2: _Group, special: list[str]) -> float:
    """shap's merge score of two neighbouring token groups (higher merges first)."""
    a, b = g1.tokens, g2.tokens
    score = 0.0
    if special and a[-1] in special and b[0] in special:
        score -= math.inf
    if b[0].startswith("##"):
        score += 20
    if b[0] == "'" and (len(b) == 1 or (len(b) == 2 and b[1] in ("t", "s"))):
        score += 15
    if a[-1] == "'" and b[0] in ("t", "s"):
        score += 15
    start_ctrl = a[0].startswith("[") and a[0].endswith("]")
    end_ctrl = b[-1].startswith("[") and b[-1].endswith("]")
    if start_ctrl != end_ctrl:
        score -= 1000
    if b[0] in _OPENERS and not g2.balanced[0]:
        score -= 100
    if a[-1] in _CLOSERS and not g1.balanced[-1]:
        score -= 100
    if a[0] in _OPENERS:  # shap compares a token object with strings here: always unequal
        score -= 2
    if a[-1] in _CONNECTORS or b[0] in _CONNECTORS:
        score -= 2
    if a[-1] == ",":
        score -= 10
    if b[0] == ",":
        score -= 10 if len(b) > 1 else 1
    if a[-1] in (".", "?", "!"):
        score -= 20
    if b[0] in (".", "?", "!"):
        score -= 20 if len(b) > 1 else 1
    return score - len(a) - len(b)


def _merge_tokens(tokens: list[str], special: list[str]) -> np.ndarray:
    m = len(tokens)
    groups = [
        _Group([t], [t not in _OPENERS and t not in _CLOSERS], i) for i, t in enumerate(tokens)
    ]
    z = np.zeros((max(m - 1, 0), 4), dtype=np.float64)
    new = m
    for _ in range(m - 1):
        scores = [_score(groups[i], groups[i + 1], special) for i in range(len(groups) - 1)]
        ind = int(np.argmax(scores))
        g1, g2 = groups[ind], groups[ind + 1]
        sizes = [z[g.index - m, 3] if g.index >= m else 1 for g in (g1, g2)]
        z[new - m] = (g1.index, g2.index, -scores[ind], sizes[0] + sizes[1])
        joined = _Group(g1.tokens + g2.tokens, g1.balanced + g2.balanced, new)
        if joined.tokens[0] in _OPENERS and g2.tokens[-1] == _OPENERS[joined.tokens[0]]:
            joined.balanced[0] = True
            joined.balanced[-1] = True
        groups[ind] = joined
        groups.pop(ind + 1)
        new += 1
    z[:, 2] += 10
    return z
