"""Owen values over a feature hierarchy, as shap's ``PartitionExplainer`` computes them.

Owen 1977; Lundberg's Partition explainer. The features form a binary tree (``clustering``: a
linkage, ``"correlation"`` over a background set, a text's token tree, an image's axis
splits; see ``methods.engine.hierarchy``). Starting at the root with the coalitions "none" and
"all", each visited node with context ``m00`` evaluates ``m00 + left`` and ``m00 + right``, and
its two children are each visited twice, once with the sibling absent and once present, at
half the weight; a node left unexpanded when ``max_evals`` runs out keeps its credit, which
is then shared among its leaves by size. The nodes to expand go in order of their largest
output change times weight, ``batch_size`` coalitions per round, exactly as shap's loop
(ties, which shap breaks at random, go in the order they were found). With the tree fully
expanded the answer is the exact Owen value; on a linear model it is the Shapley value.

The engine's share: every example's round of coalitions (and, over a background set, every
background row: the value of a coalition is the weighted mean over the rows, as shap's
maskers average before crediting) in one batched forward; the recursion's bookkeeping is a
few float64 numbers per node.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Literal, cast

import numpy as np
import torch
from pydantic import Field, field_validator
from torch import Tensor

from methods.engine import background, image_maskers
from methods.engine.background import Background
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.hierarchy import Tree, axis_tree, correlation_tree, tree
from methods.engine.inputs import Tensors
from methods.engine.masks import FeatureMasks, coalition_inputs, format_feature_mask, spread
from methods.engine.perturb import Evaluator, echo, start
from methods.errors import InvalidArgumentError
from methods.params import FeatureMaskParams
from methods.perturbation.shapley_values import working_dtype
from methods.registry import register

Linkage = list[list[float]]


class PartitionParams(FeatureMaskParams):
    max_evals: int = Field(
        500,
        ge=3,
        description="model evaluations per example (each over the background rows), the "
        "two of the empty and full coalitions included, as shap's max_evals",
    )
    clustering: Literal["correlation"] | list[Linkage] | Linkage | None = Field(
        None,
        description="the feature hierarchy: a linkage matrix (M-1, 4) as scipy writes one, "
        'one per example, or "correlation" (single linkage over the background set\'s '
        "feature correlations); default: a text's token tree (text models), an image's axis "
        'splits (one (N, C, H, W) input), "correlation" over a background set, else halves '
        "of the features in order",
    )
    image_masker: str | float | None = Field(
        None,
        description=f"what hidden image regions become: {image_maskers.FORMS}; default "
        '"blur(16,16)" for an image input without baselines; when given it replaces the '
        "baselines",
    )
    batch_size: int = Field(
        10,
        ge=1,
        description="coalitions expanded per round per example (shap's batch_size: 10; its "
        "Text masker uses 5): which nodes are expanded before max_evals runs out",
    )

    @field_validator("clustering", mode="before")
    @classmethod
    def _as_lists(cls, v: Any) -> Any:
        if isinstance(v, (np.ndarray, Tensor)):
            return np.asarray(v.detach().cpu() if isinstance(v, Tensor) else v).tolist()
        if isinstance(v, (list, tuple)) and any(isinstance(e, (np.ndarray, Tensor)) for e in v):
            return [np.asarray(e).tolist() for e in v]
        return v


@register(
    "partition",
    family="perturbation",
    params=PartitionParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=lambda p, shape: p.max_evals,
    forward_only=True,
    base_values=True,
    own_background=True,
)
def partition(call: Call, p: PartitionParams) -> Output:
    """Owen values of the features over their hierarchy (default baselines: zeros; an image
    input: its blur).

    Shape: targeted output shape + input.shape[1:], as the other perturbation methods.
    """
    xs, n = call.inputs, call.n
    image = _image_mode(xs, p)
    if p.image_masker is not None and not image:
        raise InvalidArgumentError(
            "partition: image_masker applies to one image input (N, C, H, W) without a "
            "feature_mask or clustering",
            argument="image_masker",
        )
    given = p.image_masker if p.image_masker is not None else "blur(16,16)"
    masker = image_maskers.parse(given) if image else None
    bg = call.baselines if isinstance(call.baselines, Background) else None
    if masker is not None and (p.image_masker is not None or call.baselines is None):
        bg = None  # the image masker fills the hidden regions
    else:
        masker = None
    masks = _channels_last(xs[0]) if image else format_feature_mask(p.feature_mask, xs, "partition")
    f = masks.n_features
    rows = background.formatted(bg, xs) if bg is not None else None
    trees = _trees(p, xs, masks, f, rows[0] if rows is not None else None, image)
    game = _Game(call, masks, masker, rows)
    phi, base = _owen(game, trees, f, n, p.max_evals - 2, p.batch_size)
    dtype = working_dtype(game.initial)
    out_shape = game.out_shape
    values = torch.from_numpy(phi).to(dtype=dtype, device=xs[0].device)
    values = values.reshape(f, *out_shape)
    base_t = torch.from_numpy(base).to(dtype=dtype, device=xs[0].device).reshape(out_shape)
    return Output(
        spread(values, masks, xs, "partition"),
        echo=echo(game.ev),
        base=base_t,
    )


def _image_mode(xs: Tensors, p: PartitionParams) -> bool:
    return (
        len(xs) == 1
        and xs[0].dim() == 4
        and xs[0].is_floating_point()
        and p.feature_mask is None
        and p.clustering is None
    )


def _channels_last(x: Tensor) -> FeatureMasks:
    """Each element its own feature, numbered channels last (``h * W * C + w * C + c``), as
    shap's image masker numbers an ``(H, W, C)`` image's elements."""
    _, c, h, w = x.shape
    ids = torch.arange(h * w * c, device=x.device).reshape(h, w, c).permute(2, 0, 1)
    return FeatureMasks((ids.unsqueeze(0),), torch.arange(h * w * c, device=x.device))


def _trees(
    p: PartitionParams,
    xs: Tensors,
    masks: FeatureMasks,
    f: int,
    rows: Tensors | None,
    image: bool,
) -> list[Tree]:
    n = int(xs[0].shape[0])
    given = p.clustering
    if image:
        _, c, h, w = xs[0].shape
        return [axis_tree((h, w, c))] * n
    if given is None:
        given = "correlation" if rows is not None else None
    if given is None:
        return [axis_tree((f, 1, 1))] * n
    if given == "correlation":
        if rows is None:
            raise InvalidArgumentError(
                'partition: clustering "correlation" is computed over a background set; '
                'pass baselines {"background": rows}, or a linkage',
                argument="clustering",
            )
        one = tree(correlation_tree(_columns(rows, masks, f)), f, "the correlation linkage")
        return [one] * n
    if given and isinstance(given[0], list) and (not given[0] or isinstance(given[0][0], list)):
        if len(given) != n:
            raise InvalidArgumentError(
                f"partition: clustering gives {len(given)} linkages but there are {n} "
                "examples; give one linkage, or one per example",
                argument="clustering",
            )
        out = []
        for i, z in enumerate(given):
            leaves = len(cast(list[Any], z)) + 1
            if leaves > f:
                raise InvalidArgumentError(
                    f"partition: clustering[{i}] covers {leaves} features but the inputs have {f}",
                    argument="clustering",
                )
            out.append(tree(np.asarray(z, dtype=np.float64), leaves, f"clustering[{i}]"))
        return out
    return [tree(np.asarray(given, dtype=np.float64), f, "clustering")] * n


def _columns(rows: Tensors, masks: FeatureMasks, f: int) -> Tensor:
    """The background as (B, F): each feature's mean over its elements, per row."""
    if masks.rows != 1:
        raise InvalidArgumentError(
            'partition: clustering "correlation" needs one feature_mask shared by every '
            "example (dim 0 of 1)",
            argument="clustering",
        )
    b = int(rows[0].shape[0])
    total = torch.zeros(b, f, dtype=torch.float64, device=rows[0].device)
    count = torch.zeros(f, dtype=torch.float64, device=rows[0].device)
    for idx, r in zip(masks.index, rows, strict=True):
        flat = idx.reshape(-1)
        total.index_add_(1, flat, r.reshape(b, -1).to(torch.float64))
        count.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))
    return total / count.clamp(min=1)


class _Game:
    """The coalition values: ``value(keep)`` for keep (k, N, F) bool is (k, N, R) float64
    (R: the targeted output's elements per example), a weighted mean over the background rows
    where there is a background."""

    def __init__(
        self,
        call: Call,
        masks: FeatureMasks,
        masker: image_maskers.ImageMasker | None,
        rows: tuple[Tensors, Tensor] | None,
    ) -> None:
        xs, n = call.inputs, call.n
        self.n, self.masker = n, masker
        self.weights: Tensor | None = None
        if rows is not None:
            bg_rows, self.weights = rows
            b = int(bg_rows[0].shape[0])
            on, off = background.tiled(xs, bg_rows)
            sub = call.expanded(b).replace(inputs=on, baselines=off)
            if masks.rows > 1:  # per-example masks tiled with their examples
                masks = FeatureMasks(
                    tuple(i.repeat((b,) + (1,) * (i.dim() - 1)) for i in masks.index), masks.ids
                )
        elif masker is not None and masker.inpaint is None:
            on, off, sub = xs, (image_maskers.fill(masker, xs[0]),), call
        else:
            on, off, sub = xs, format_baselines(call.baselines, xs), call
        self.on, self.off, self.tiled_masks = on, off, masks
        self.ev: Evaluator
        self.ev, initial = start(sub, on)
        if not self.ev.per_example:
            raise InvalidArgumentError(
                f"partition credits each example's own output, but the model's targeted output "
                f"has shape {tuple(initial.shape)} for {sub.n} rows (not one row per example); "
                "pass a target selecting a value per example",
                argument="target",
            )
        self.initial = initial
        self.out_shape = (n, *self.ev.out_shape[1:])
        self.full = self._fold(initial.unsqueeze(0))[0]  # the all-present coalition

    def value(self, keep: Tensor) -> np.ndarray:
        k = int(keep.shape[0])
        rows = self.weights.shape[0] if self.weights is not None else 1
        tiled = keep.repeat(1, rows, 1) if rows > 1 else keep

        def build(s: int, e: int) -> Tensors:
            if self.masker is not None and self.masker.inpaint is not None:
                shown = coalition_inputs(
                    self.tiled_masks,
                    tiled[s:e],
                    (torch.ones_like(self.on[0], dtype=torch.bool),),
                    (torch.zeros_like(self.on[0], dtype=torch.bool),),
                )[0]
                stacked = self.on[0].repeat((e - s,) + (1,) * (self.on[0].dim() - 1))
                return (image_maskers.inpainted(self.masker, stacked, shown),)
            return coalition_inputs(self.tiled_masks, tiled[s:e], self.on, self.off)

        return self._fold(self.ev.run(k, build))

    def _fold(self, out: Tensor) -> np.ndarray:
        """(k, N * rows, *rest) outputs as (k, N, R) float64, averaged over the rows."""
        k = int(out.shape[0])
        r = int(np.prod(self.out_shape[1:], dtype=np.int64))
        v = out.detach().to(torch.float64).reshape(k, -1, self.n, r)
        if self.weights is not None:
            w = self.weights.to(device=v.device, dtype=torch.float64).reshape(1, -1, 1, 1)
            return (v * w).sum(1).cpu().numpy()
        return v[:, 0].cpu().numpy()


_Item = tuple[tuple[int, ...], np.ndarray, np.ndarray, int, float]


def _owen(
    game: _Game, trees: list[Tree], f: int, n: int, max_evals: int, batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """shap's ``PartitionExplainer.owen`` for each example, the examples' rounds evaluated
    together. Returns phi (F, N, R) and the base values (N, R)."""
    empty = np.stack([_empty_row(t, f) for t in trees])  # (N, F)
    f00 = game.value(torch.from_numpy(empty).unsqueeze(0))[0]  # (N, R)
    f11 = game.full
    order = itertools.count()  # ties go first found, first expanded
    queues: list[list[tuple[float, int, _Item]]] = []
    dvalues: list[np.ndarray] = []
    counts = [0] * n
    for i, t in enumerate(trees):
        queues.append([(0.0, next(order), ((), f00[i], f11[i], t.root, 1.0))])
        dvalues.append(np.zeros((2 * t.leaves - 1, f00.shape[1])))
    while any(queues):
        batches = [
            _round(t, queues[i], dvalues[i], counts[i], max_evals, batch_size)
            for i, t in enumerate(trees)
        ]
        k = 2 * max(len(b) for b in batches)
        if k == 0:
            continue
        keep = np.ones((k, n, f), dtype=bool)  # examples with fewer: padded, all present
        for i, batch in enumerate(batches):
            _fill(keep, i, trees[i], empty[i], batch)
        out = game.value(torch.from_numpy(keep).to(game.on[0].device))  # (k, N, R)
        for i, batch in enumerate(batches):
            if batch:
                counts[i] += 2 * len(batch)
                _push(queues[i], batch, out[0 : 2 * len(batch), i], order)
    phi = np.zeros((f, n, f00.shape[1]))
    for i, t in enumerate(trees):
        phi[: t.leaves, i] = _lower_credit(t, dvalues[i])
    return phi, f00


def _round(
    t: Tree,
    queue: list[tuple[float, int, _Item]],
    dvalues: np.ndarray,
    count: int,
    max_evals: int,
    batch_size: int,
) -> list[tuple[_Item, int, int]]:
    """One round of shap's loop for one example: the nodes to expand now (two coalitions
    each); past ``max_evals`` every queued node keeps its credit."""
    if count >= max_evals:
        while queue:
            _, _, (_, g00, g11, node, weight) = heapq.heappop(queue)
            dvalues[node] += (g11 - g00) * weight
        return []
    batch: list[tuple[_Item, int, int]] = []
    while queue and 2 * len(batch) < batch_size and count + 2 * len(batch) < max_evals:
        _, _, item = heapq.heappop(queue)
        _, g00, g11, node, weight = item
        if node < t.leaves or t.linkage[node - t.leaves, 2] < 0:  # a leaf, or not to split
            dvalues[node] += (g11 - g00) * weight
            continue
        left, right = t.children(node)
        batch.append((item, left, right))
    return batch


def _fill(
    keep: np.ndarray, i: int, t: Tree, empty: np.ndarray, batch: list[tuple[_Item, int, int]]
) -> None:
    """Example ``i``'s coalitions of a round into ``keep`` (k, N, F): each expanded node's
    context plus its left child, then plus its right."""
    for j, ((nodes, *_), left, right) in enumerate(batch):
        pair = keep[2 * j : 2 * j + 2, i]
        pair[:] = empty
        for node in nodes:
            pair[:, t.order[t.start[node] : t.end[node]]] = True
        pair[0, t.order[t.start[left] : t.end[left]]] = True
        pair[1, t.order[t.start[right] : t.end[right]]] = True


def _push(
    queue: list[tuple[float, int, _Item]],
    batch: list[tuple[_Item, int, int]],
    out: np.ndarray,
    order: itertools.count[int],
) -> None:
    """Each expanded node's four children queued (each child with its sibling absent, then
    present), by their largest output change times their weight, as shap orders them."""
    g00 = np.stack([item[1] for item, _, _ in batch])
    g11 = np.stack([item[2] for item, _, _ in batch])
    g10, g01 = out[0::2], out[1::2]
    w = np.array([item[4] for item, _, _ in batch]) / 2
    changes = np.stack([g10 - g00, g01 - g00, g11 - g01, g11 - g10])  # (4, J, R)
    priority = -np.abs(changes).max(axis=2) * w  # (4, J)
    for j, ((nodes, *_), left, right) in enumerate(batch):
        wj = float(w[j])
        children = (
            (left, nodes, g00[j], g10[j]),
            (right, nodes, g00[j], g01[j]),
            (left, (*nodes, right), g01[j], g11[j]),
            (right, (*nodes, left), g10[j], g11[j]),
        )
        for c, (child, ctx, lo, hi) in enumerate(children):
            heapq.heappush(queue, (float(priority[c, j]), next(order), (ctx, lo, hi, child, wj)))


def _empty_row(t: Tree, f: int) -> np.ndarray:
    """The empty coalition of ``t``'s features (features outside the tree always present)."""
    row = np.ones(f, dtype=bool)
    row[t.order] = False
    return row


def _lower_credit(t: Tree, dvalues: np.ndarray) -> np.ndarray:
    """Each internal node's credit shared among its leaves by size (shap's ``lower_credit``:
    down the tree, each child taking its share of its parent's total by size). A leaf's
    share works out to the sum over its ancestors of credit / size, added here over each
    node's range of the leaf order at once."""
    m = t.leaves
    out = dvalues[:m].copy()
    if m == 1:
        return out
    density = dvalues[m:] / (t.end[m:] - t.start[m:])[:, None]
    diff = np.zeros((m + 1, dvalues.shape[1]))
    np.add.at(diff, t.start[m:], density)
    np.add.at(diff, t.end[m:], -density)
    out[t.order] += np.cumsum(diff[:m], axis=0)
    return out
