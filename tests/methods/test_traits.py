"""What the registry tells a server about each method: cost, merging, token counterpart,
tensor and Python-only params, limits, target use. Parametrized over every registered method,
so a new method is checked the moment it is registered."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import methods
from methods import registry
from methods.gradient.integrated_gradients import LADDERS, ladder_top
from methods.params import NoParams, parse_params
from methods.registry import CostShape, MethodSpec
from service.kinds.checks import limit_value, limits
from tests import zoo
from tests.methods.conformance_args import kwargs_for

SPECS = registry.specs()
IDS = [s.name for s in SPECS]
SMALL = CostShape(((6,),))
#: values for the params without a default, on the 3-class MLP
REQUIRED: dict[str, Any] = {"layer": "net.2", "neuron_selector": 1, "sliding_window_shapes": (2,)}


def _defaults(spec: MethodSpec, **given: Any) -> Any:
    fields = spec.params.model_fields
    raw = {k: v for k, v in REQUIRED.items() if k in fields and fields[k].is_required()}
    return parse_params(spec.params, spec.name, {**raw, **given})


class Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = zoo.MLP((6, 16, 16, 3)).double()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.net(x)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_cost_of_the_defaults_is_at_least_one_row(spec: MethodSpec) -> None:
    p = _defaults(spec)
    assert spec.cost(p, SMALL) >= 1
    assert spec.cost(p, CostShape(((6,),), n_baselines=3, return_delta=True)) >= 1


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_derived_traits_name_real_fields(spec: MethodSpec) -> None:
    fields = set(spec.params.model_fields)
    assert spec.tensor_params <= fields
    assert spec.python_only_params <= fields
    assert not spec.tensor_params & spec.python_only_params
    assert set(limits(spec)) <= fields and set(limits(spec).values()) <= {"steps", "samples"}
    assert spec.layer_param == ("layer" in fields)
    p = _defaults(spec)
    for name in limits(spec):
        value = limit_value(spec, p, name)
        assert isinstance(value, int) and value >= 1


def test_derived_traits_examples() -> None:
    get = registry.get
    assert "feature_mask" in get("feature_ablation").tensor_params
    assert {"layer_baselines", "layer_mask"} <= get("layer_feature_ablation").tensor_params
    assert "custom_attribution_func" in get("deeplift").python_only_params
    assert limits(get("integrated_gradients")) == {"n_steps": "steps"}
    assert limits(get("lime")) == {"n_samples": "samples"}
    assert get("guided_gradcam").layer_param and not get("saliency").layer_param
    assert not limits(get("saliency")) and not get("saliency").tensor_params


@pytest.mark.parametrize("rule", sorted(LADDERS))
def test_auto_steps_cost_the_top_of_their_ladder(rule: str) -> None:
    spec = registry.get("integrated_gradients")
    p = _defaults(spec, n_steps="auto", approximation_method=rule)
    top = LADDERS[rule][-1]
    assert ladder_top(rule) == top
    assert spec.cost(p, SMALL) == top
    assert spec.cost(p, CostShape(((6,),), return_delta=True)) == top + 2
    assert limit_value(spec, p, "n_steps") == top
    assert spec.coupled(p)
    fixed = _defaults(spec, n_steps=7, approximation_method=rule)
    assert spec.cost(fixed, SMALL) == 7 and limit_value(spec, fixed, "n_steps") == 7
    assert not spec.coupled(fixed)


@pytest.mark.parametrize("name", ["kernel_shap", "lime", "gradient_shap", "layer_gradient_shap"])
def test_sampled_methods_cost_their_real_default(name: str) -> None:
    spec = registry.get(name)
    default = spec.params.model_fields["n_samples"].default
    assert spec.cost(_defaults(spec), SMALL) == default
    if name in ("kernel_shap", "lime"):
        assert default == 25
    assert spec.cost(_defaults(spec, n_samples=9), SMALL) == 9


@pytest.mark.parametrize(
    "mask",
    [
        np.array([[0, 0, 1, 1, 5, 5]]),
        torch.tensor([[0, 0, 1, 1, 5, 5]]),
        (torch.tensor([[0, 0, 1]]), np.array([[1, 5, 5]])),
        [[0, 0, 1, 1, 5, 5]],
    ],
    ids=["numpy", "torch", "tuple", "list"],
)
def test_per_feature_cost_counts_distinct_ids(mask: Any) -> None:
    for name in ("feature_ablation", "feature_permutation", "neuron_feature_ablation"):
        spec = registry.get(name)
        assert spec.cost(_defaults(spec, feature_mask=mask), SMALL) == 3 + 1
    sampling = registry.get("shapley_value_sampling")
    assert sampling.cost(_defaults(sampling, feature_mask=mask, n_samples=4), SMALL) == 4 * 4
    exact = registry.get("shapley_values")
    assert exact.cost(_defaults(exact, feature_mask=mask), SMALL) == 2**3
    layer = registry.get("layer_feature_ablation")
    assert layer.cost(_defaults(layer, layer_mask=mask), SMALL) == 3 + 1


def test_per_feature_cost_without_a_mask_counts_every_scalar() -> None:
    spec = registry.get("feature_ablation")
    assert spec.cost(_defaults(spec), CostShape(((3, 4), (5,)))) == 12 + 5 + 1
    assert registry.get("shapley_values").cost(_defaults(registry.get("shapley_values")),
                                                 CostShape(((100,),))) == 2**62  # fmt: skip


@pytest.mark.parametrize(
    ("window", "strides", "dims"),
    [((2,), None, (6,)), ((2,), 2, (6,)), ((3,), (2,), (6,)), ((3, 2, 2), (1, 2, 2), (3, 8, 8)),
     ((3, 3, 3), 2, (3, 8, 8))],
)  # fmt: skip
def test_occlusion_and_per_feature_costs_are_the_forwards_the_engine_runs(
    window: tuple[int, ...], strides: Any, dims: tuple[int, ...]
) -> None:
    model = Counting() if dims == (6,) else zoo.CNN().double()
    x = torch.randn(2, *dims, dtype=torch.float64)
    spec = registry.get("occlusion")
    p = _defaults(spec, sliding_window_shapes=window, strides=strides)
    expected = spec.cost(p, CostShape((dims,)))
    if isinstance(model, Counting):
        methods.attribute(model, x, "occlusion", target=0, perturbations_per_eval=1,
                          sliding_window_shapes=window, strides=strides)  # fmt: skip
        assert model.calls == expected
    else:
        r = methods.attribute(model, x, "occlusion", target=0, sliding_window_shapes=window,
                              strides=strides)  # fmt: skip
        assert isinstance(r.attributions, torch.Tensor) and r.attributions.shape == x.shape
        windows = 1
        for d, w, s in zip(dims, window, strides if isinstance(strides, tuple) else
                           (strides,) * len(dims), strict=True):  # fmt: skip
            windows *= -(-(d - w) // s) + 1
        assert expected == windows + 1
    ablation = Counting()
    methods.attribute(ablation, torch.randn(2, 6, dtype=torch.float64), "feature_ablation",
                      target=0, perturbations_per_eval=1)  # fmt: skip
    fa = registry.get("feature_ablation")
    assert ablation.calls == fa.cost(_defaults(fa), SMALL)


def test_deeplift_shap_costs_two_rows_per_baseline() -> None:
    for name in ("deeplift_shap", "layer_deeplift_shap", "neuron_deeplift_shap"):
        spec = registry.get(name)
        assert spec.cost(_defaults(spec), CostShape(((6,),), n_baselines=5)) == 10
        assert spec.cost(_defaults(spec), SMALL) == 2
        assert spec.baseline_distribution


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_merging(spec: MethodSpec) -> None:
    p = _defaults(spec)
    never = {"feature_permutation", "kernel_shap", "lime"}
    assert spec.coupled(p) == (spec.name in never)
    # the integrated gradients with n_steps="auto", and shapley_value_sampling with
    # n_samples="auto", couple the examples only then (they stop when every example is done)
    by_steps = {"integrated_gradients", "layer_integrated_gradients", "neuron_integrated_gradients"}
    by_samples = {"shapley_value_sampling"}
    only_auto = by_steps | by_samples
    assert (spec.couples_examples is not None and spec.name not in only_auto) == (
        spec.name in never
    )
    if spec.name in by_steps:
        assert spec.coupled(_defaults(spec, n_steps="auto"))
    if spec.name in by_samples:
        assert spec.coupled(_defaults(spec, n_samples="auto"))


@pytest.mark.parametrize(
    "spec", [s for s in SPECS if s.differentiates_inputs and s.family != "layer"],
    ids=[s.name for s in SPECS if s.differentiates_inputs and s.family != "layer"],
)  # fmt: skip
def test_token_counterparts_are_registered_layer_methods(spec: MethodSpec) -> None:
    tc = spec.token_counterpart
    if tc is None:  # stated at registration (register refuses to guess)
        return
    other = registry.get(tc.method)
    assert other.family == "layer" and other.layer_param
    assert tc.drop_params <= set(spec.params.model_fields)
    assert set(tc.set_params) <= set(other.params.model_fields)
    # the request's params, rewritten as the service rewrites them, are the counterpart's
    kept = set(spec.params.model_fields) - tc.drop_params
    assert kept <= set(other.params.model_fields), kept - set(other.params.model_fields)
    p = _defaults(spec)
    rewritten = {k: getattr(p, k) for k in kept}
    rewritten.update(tc.set_params, layer="net.0")
    parse_params(other.params, other.name, rewritten)


def test_token_counterparts_of_the_gradient_family() -> None:
    want = {
        "integrated_gradients": "layer_integrated_gradients",
        "input_x_gradient": "layer_gradient_x_activation",
        "saliency": "layer_gradient_x_activation",
        "gradient_shap": "layer_gradient_shap",
        "deeplift": "layer_deeplift",
        "deeplift_shap": "layer_deeplift_shap",
        "lrp": "layer_lrp",
    }
    for name, layer in want.items():
        tc = registry.get(name).token_counterpart
        assert tc is not None and tc.method == layer
    sal = registry.get("saliency").token_counterpart
    assert sal is not None and sal.post_abs and sal.drop_params == {"abs"}
    assert dict(sal.set_params) == {"multiply_by_inputs": False}
    with pytest.raises(TypeError):
        sal.set_params["abs"] = True  # type: ignore[index]


def test_register_insists_on_a_stated_token_counterpart() -> None:
    with pytest.raises(RuntimeError, match="token_counterpart"):
        registry.register("not_a_method", family="gradient", params=NoParams)


NO_TARGET = [s for s in SPECS if not s.needs_target]


@pytest.mark.parametrize("spec", NO_TARGET, ids=[s.name for s in NO_TARGET])
def test_methods_that_need_no_target_run_without_one(spec: MethodSpec) -> None:
    c = zoo.by_name("mlp")  # three classes: target=None would not select one value
    kw = kwargs_for(spec, c)
    kw.pop("target")
    free = methods.attribute(c.model, c.inputs, spec.name, target=None, seed=3, **kw)
    aimed = methods.attribute(c.model, c.inputs, spec.name, target=2, seed=3, **kw)
    a = free.attributions if isinstance(free.attributions, tuple) else (free.attributions,)
    b = aimed.attributions if isinstance(aimed.attributions, tuple) else (aimed.attributions,)
    for u, v in zip(a, b, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=0)  # the target is ignored


def test_needs_target_marks_neurons_and_activations_only() -> None:
    free = {s.name for s in SPECS if not s.needs_target}
    assert "layer_activation" in free
    # neuron conductance flows through the neuron into the targeted output: it needs a target
    assert free - {"layer_activation"} == {
        s.name for s in SPECS if s.family == "neuron" and s.name != "neuron_conductance"
    }
