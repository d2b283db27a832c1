"""Permutation feature importance: the output change when a feature is shuffled across the batch.

Breiman 2001, https://doi.org/10.1023/A:1010933404324; Captum's FeaturePermutation. Each
feature (group) gets its own random non-identity permutation of the examples; a group spanning
several inputs is shuffled with one permutation (Captum draws one per input tensor), so the
group's values stay together. A batch of one has nothing to shuffle with: its one
"permutation" is the identity, and its attributions are zero (Captum's answer too). An input
that is not per example (Captum's sparse features) has its own rows shuffled.
"""

from __future__ import annotations

import torch
from torch import Tensor

from methods.cost import per_feature_cost
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.masks import drop_one_inputs, format_feature_mask, spread
from methods.engine.perturb import echo, evaluate_with_initial
from methods.params import FeatureMaskParams
from methods.registry import register

#: redraws of identity permutations before falling back to a cyclic shift (keeps it finite)
_REDRAWS = 64


class FeaturePermutationParams(FeatureMaskParams):
    pass


def _permutations(call: Call, f: int, n: int, device: torch.device) -> Tensor:
    """(F, N) random permutations of range(N), none the identity (for N >= 2)."""
    if n < 2:
        return torch.zeros((f, n), dtype=torch.long, device=device)
    like = torch.empty(0, device=device)
    perms = torch.argsort(call.rand((f, n), like), dim=1)
    ident = torch.arange(n, device=device)
    for _ in range(_REDRAWS):
        same = (perms == ident).all(1)
        if not bool(same.any()):
            return perms
        redraw = torch.argsort(call.rand((int(same.sum()), n), like), dim=1)
        perms[same] = redraw
    same = (perms == ident).all(1)
    perms[same] = ident.roll(1)
    return perms


@register(
    "feature_permutation",
    family="perturbation",
    sparse_inputs=True,
    params=FeaturePermutationParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    stochastic=True,
    cost=per_feature_cost(),
    couples_examples=lambda p: True,  # features permuted across the batch
    forward_only=True,
)
def feature_permutation(call: Call, p: FeaturePermutationParams) -> Output:
    """Output change when each feature is permuted across the examples of the batch."""
    xs = call.inputs
    n = call.n
    masks = format_feature_mask(p.feature_mask, xs, call.method)
    f = masks.n_features
    # one permutation of the examples per feature; an input that is not per example (Captum's
    # sparse features) has its own rows permuted, as Captum does
    perms = {n: _permutations(call, f, n, xs[0].device)}
    for x in xs:
        rows = int(x.shape[0])
        if rows not in perms:
            perms[rows] = _permutations(call, f, rows, xs[0].device)

    def build(s: int, e: int) -> Tensors:
        shuffled = tuple(x[perms[int(x.shape[0])][s:e]] for x in xs)  # (k, rows, ...) per input
        return drop_one_inputs(masks, s, e, xs, shuffled)

    ev, initial, permuted = evaluate_with_initial(call, xs, f, build)
    diff = initial.reshape(1, -1) - permuted.reshape(f, -1)
    return Output(spread(diff, masks, xs, call.method), echo=echo(ev))
