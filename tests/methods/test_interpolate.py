"""``interpolate_to_input``: layer attributions upsampled to the input's spatial size, as a
Captum user does with ``LayerAttribution.interpolate``. Parametrized over every registered
layer method, so a new one is checked the moment it is registered."""

from __future__ import annotations

from typing import Any, get_args

import pytest
import torch
import torch.nn.functional as F
from captum.attr import LayerAttribution, LayerGradCam
from torch import nn

import methods
from methods import registry
from methods.errors import InvalidArgumentError
from methods.layer._common import InterpolateMode
from methods.params import parse_params
from methods.registry import CostShape, MethodSpec
from service.kinds.checks import limits
from tests import zoo
from tests.methods.conformance_args import kwargs_for

LAYER_SPECS = [s for s in registry.specs() if s.family == "layer"]
LAYER_IDS = [s.name for s in LAYER_SPECS]


class OddCNN(nn.Module):
    """A strided conv to 5x5 on an 11x11 image: a non-integer upsampling factor."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, stride=2)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(4, 5, 3, padding=1)
        self.fc = nn.Linear(5 * 5 * 5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu(self.conv2(self.relu(self.conv1(x)))).flatten(1))


class TwoImages(nn.Module):
    """An image (3, 8, 8) and a smaller side image (1, 4, 4), joined after a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, stride=2, padding=1)
        self.fc = nn.Linear(2 * 4 * 4 + 16, 2)

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.conv(x).flatten(1), side.flatten(1)], dim=1))


def _odd() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    model = OddCNN().double().eval()
    x = torch.randn(3, 3, 11, 11, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    return model, x


def _kwargs(spec: MethodSpec, case: zoo.Case) -> dict[str, Any]:
    return {**kwargs_for(spec, case), "layer": "conv2"}  # 4x4 on the 8x8 input


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic", "area", "nearest-exact"])
@pytest.mark.parametrize(
    ("model_name", "layer"),
    [("cnn", "conv2"), ("cnn", "pool1"), ("odd", "conv2"), ("odd", "conv1")],
)
def test_gradcam_equals_captum_then_interpolate(model_name: str, layer: str, mode: str) -> None:
    if model_name == "cnn":
        c = zoo.by_name("cnn")
        model, x, target = c.model, c.inputs, c.target
    else:
        (model, x), target = _odd(), [0, 2, 1]
    assert isinstance(x, torch.Tensor)
    for relu, summation in ((False, True), (True, False)):
        ref = LayerAttribution.interpolate(
            LayerGradCam(model, model.get_submodule(layer)).attribute(
                x, target=target, relu_attributions=relu, attr_dim_summation=summation
            ),
            x.shape[2:],
            mode,
        )
        ours = methods.attribute(
            model,
            x,
            "layer_gradcam",
            target=target,
            layer=layer,
            relu_attributions=relu,
            attr_dim_summation=summation,
            interpolate_to_input=True,
            interpolate_mode=mode,
        )
        a = ours.attributions
        assert isinstance(a, torch.Tensor) and a.dtype == torch.float64
        assert a.shape == (*ref.shape[:2], *x.shape[2:])
        torch.testing.assert_close(a, ref.detach(), rtol=1e-10, atol=1e-12)
        assert ours.params["interpolate_to_input"] is True
        assert ours.params["interpolate_mode"] == mode


@pytest.mark.parametrize("spec", LAYER_SPECS, ids=LAYER_IDS)
def test_every_layer_method_upsamples_its_own_result(spec: MethodSpec) -> None:
    c = zoo.by_name("cnn")
    kw = _kwargs(spec, c)
    plain = methods.attribute(c.model, c.inputs, spec.name, seed=5, **kw)
    ours = methods.attribute(
        c.model,
        c.inputs,
        spec.name,
        seed=5,
        interpolate_to_input=True,
        interpolate_mode="bilinear",
        **kw,
    )
    x = c.inputs
    assert isinstance(x, torch.Tensor)
    for a, p in zip(_tuple(ours.attributions), _tuple(plain.attributions), strict=True):
        assert p.shape[2:] != x.shape[2:]  # the layer really is smaller
        assert a.shape == (*p.shape[:2], *x.shape[2:])
        torch.testing.assert_close(
            a, F.interpolate(p, size=x.shape[2:], mode="bilinear"), rtol=0, atol=0
        )


@pytest.mark.parametrize("name", ["layer_activation", "layer_gradient_x_activation"])
def test_layer_input_attributions_upsample_too(name: str) -> None:
    model, x = _odd()
    r = methods.attribute(
        model,
        x,
        name,
        target=1,
        layer="conv2",
        attribute_to_layer_input=True,
        interpolate_to_input=True,
    )
    assert isinstance(r.attributions, torch.Tensor)
    assert r.attributions.shape == (3, 4, 11, 11)


def test_convergence_delta_and_outputs_unchanged() -> None:
    c = zoo.by_name("cnn")
    kw = {"target": c.target, "layer": "conv2", "n_steps": 10, "return_convergence_delta": True}
    plain = methods.attribute(c.model, c.inputs, "layer_integrated_gradients", **kw)
    ours = methods.attribute(
        c.model, c.inputs, "layer_integrated_gradients", interpolate_to_input=True, **kw
    )
    assert ours.convergence_delta is not None and plain.convergence_delta is not None
    assert torch.equal(ours.convergence_delta, plain.convergence_delta)
    assert plain.outputs is not None and ours.outputs is not None
    assert torch.equal(ours.outputs, plain.outputs)


def test_noise_tunnel_result_is_upsampled_after_aggregation() -> None:
    # a Captum user interpolates NoiseTunnel(LayerGradCam)'s result: squaring (smoothgrad_sq)
    # does not commute with bilinear upsampling, so the order shows
    c = zoo.by_name("cnn")
    nt = {"nt_type": "smoothgrad_sq", "nt_samples": 3, "stdevs": 0.3}
    kw = {"target": c.target, "layer": "conv2", "noise_tunnel": nt, "seed": 11}
    plain = methods.attribute(c.model, c.inputs, "layer_gradcam", **kw)
    ours = methods.attribute(
        c.model,
        c.inputs,
        "layer_gradcam",
        interpolate_to_input=True,
        interpolate_mode="bilinear",
        **kw,
    )
    assert isinstance(plain.attributions, torch.Tensor)
    expected = F.interpolate(plain.attributions, size=(8, 8), mode="bilinear")
    torch.testing.assert_close(ours.attributions, expected, rtol=0, atol=0)


def test_multi_input_models_upsample_to_the_first_input() -> None:
    torch.manual_seed(8)
    model = TwoImages().double().eval()
    g = torch.Generator().manual_seed(9)
    xs = (
        torch.randn(2, 3, 8, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 1, 4, 4, generator=g, dtype=torch.float64),
    )
    r = methods.attribute(
        model, xs, "layer_gradcam", target=0, layer="conv", interpolate_to_input=True
    )
    assert isinstance(r.attributions, torch.Tensor)
    assert r.attributions.shape == (2, 1, 8, 8)


def test_default_false_is_bit_for_bit_unchanged() -> None:
    c = zoo.by_name("cnn")
    assert isinstance(c.inputs, torch.Tensor)
    mod = c.model.get_submodule("conv2")
    ref = LayerGradCam(c.model, mod).attribute(c.inputs, target=c.target)
    runs = [
        methods.attribute(c.model, c.inputs, "layer_gradcam", target=c.target, layer="conv2", **kw)
        for kw in ({}, {"interpolate_to_input": False}, {"interpolate_mode": "bicubic"})
    ]
    for r in runs:
        a = r.attributions
        assert isinstance(a, torch.Tensor) and a.shape == ref.shape == (3, 1, 4, 4)
        torch.testing.assert_close(a, ref.detach(), rtol=1e-10, atol=1e-12)
        assert torch.equal(a, runs[0].attributions)  # type: ignore[arg-type]


def test_linear_layer_raises_the_typed_error_naming_the_param() -> None:
    c = zoo.by_name("cnn")
    with pytest.raises(
        InvalidArgumentError, match=r"'fc'.*\[N, 4\].*no spatial dims.*\[8, 8\]"
    ) as e:
        methods.attribute(
            c.model, c.inputs, "layer_activation", layer="fc", interpolate_to_input=True
        )
    assert e.value.argument == "interpolate_to_input"


def test_inputs_without_spatial_dims_raise_before_running() -> None:
    c = zoo.by_name("mlp")
    with pytest.raises(InvalidArgumentError, match=r"inputs\[0\] is \[N, 6\]") as e:
        methods.attribute(
            c.model,
            c.inputs,
            "layer_gradcam",
            target=c.target,
            layer="net.0",
            interpolate_to_input=True,
        )
    assert e.value.argument == "interpolate_to_input"


class _Counting(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.calls = model, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.model(x)


@pytest.mark.parametrize("mode", ["linear", "trilinear"])
def test_a_mode_of_another_rank_is_rejected_before_the_model_runs(mode: str) -> None:
    c = zoo.by_name("cnn")
    model = _Counting(c.model)
    with pytest.raises(InvalidArgumentError, match=f"'{mode}' needs .*bilinear") as e:
        methods.attribute(
            model,
            c.inputs,
            "layer_gradcam",
            target=c.target,
            layer="model.conv2",
            interpolate_to_input=True,
            interpolate_mode=mode,
        )
    assert e.value.argument == "interpolate_mode"
    assert model.calls == 0


def test_unknown_mode_is_a_params_error() -> None:
    c = zoo.by_name("cnn")
    with pytest.raises(InvalidArgumentError) as e:
        methods.attribute(
            c.model,
            c.inputs,
            "layer_gradcam",
            target=c.target,
            layer="conv2",
            interpolate_to_input=True,
            interpolate_mode="cubic",
        )
    assert e.value.argument == "interpolate_mode"


@pytest.mark.parametrize("spec", LAYER_SPECS, ids=LAYER_IDS)
def test_params_are_in_the_published_schema(spec: MethodSpec) -> None:
    props = spec.info().params["properties"]
    assert props["interpolate_to_input"]["type"] == "boolean"
    assert props["interpolate_to_input"]["default"] is False
    assert props["interpolate_to_input"]["description"]
    mode = props["interpolate_mode"]
    assert mode["default"] == "nearest"
    assert set(mode["enum"]) == set(get_args(InterpolateMode))
    assert {"nearest", "bilinear", "bicubic", "area", "nearest-exact"} <= set(mode["enum"])


def test_only_layer_methods_take_it() -> None:
    for spec in registry.specs():
        has = "interpolate_to_input" in spec.params.model_fields
        assert has == (spec.family == "layer"), spec.name


@pytest.mark.parametrize("spec", LAYER_SPECS, ids=LAYER_IDS)
def test_traits_unchanged_by_the_params(spec: MethodSpec) -> None:
    def parsed(**kw: Any) -> Any:
        return parse_params(spec.params, spec.name, {"layer": "conv2", **kw})

    plain, up = parsed(), parsed(interpolate_to_input=True, interpolate_mode="bilinear")
    shape = CostShape(((3, 8, 8),), n_baselines=2)
    assert spec.cost(up, shape) == spec.cost(plain, shape)
    assert spec.coupled(up) == spec.coupled(plain)
    assert not {"interpolate_to_input", "interpolate_mode"} & (
        spec.tensor_params | spec.python_only_params | set(limits(spec))
    )
