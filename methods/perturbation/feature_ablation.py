"""Feature ablation: the output change when each feature (group) is replaced by its baseline.

Zeiler & Fergus 2014 (occlusion analysis), https://arxiv.org/abs/1311.2901, in Captum's form.
"""

from __future__ import annotations

import torch

from methods.cost import per_feature_cost
from methods.engine.baselines import format_baselines
from methods.engine.call import Call, Output
from methods.engine.masks import drop_one_inputs, format_feature_mask, spread
from methods.engine.perturb import echo, evaluate_with_initial
from methods.params import FeatureMaskParams
from methods.registry import register


class FeatureAblationParams(FeatureMaskParams):
    pass


@register(
    "feature_ablation",
    generation="per_output",
    family="perturbation",
    sparse_inputs=True,
    params=FeatureAblationParams,
    batching="perturbations_per_eval",
    differentiates_inputs=False,
    cost=per_feature_cost(),
    forward_only=True,
)
def feature_ablation(call: Call, p: FeatureAblationParams) -> Output:
    """Output change when each feature is replaced by its baseline (default zero).

    Without a target and with several values per example, one attribution per output value:
    shape (n_outputs, *input.shape[1:]), as Captum.
    """
    xs = call.inputs
    masks = format_feature_mask(p.feature_mask, xs, call.method)
    bs = format_baselines(call.baselines, xs)
    f = masks.n_features

    def build(s: int, e: int) -> tuple[torch.Tensor, ...]:
        return drop_one_inputs(masks, s, e, xs, bs)  # perturbation j ablates feature j

    ev, initial, ablated = evaluate_with_initial(call, xs, f, build, unperturbed_first=True)
    diff = (initial - ablated).reshape(f, -1)  # (F, n_outputs)
    attrs = spread(diff, masks, xs, call.method)
    return Output(attrs, echo=echo(ev))
