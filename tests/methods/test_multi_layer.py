"""A list of layers (Captum's multi-layer form, CONTRACT §7.7): one result per layer, each what
that layer alone gives; one forward and backward for the methods that read the layer."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import (
    LayerActivation,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    LayerLRP,
)
from torch import nn

import methods

F64 = torch.float64
LAYERS = ["0", "2", "3"]
LAYER_METHODS = [
    "layer_activation", "layer_gradient_x_activation", "layer_lrp", "layer_integrated_gradients",
    "layer_conductance", "layer_gradient_shap", "layer_deeplift", "layer_deeplift_shap",
    "layer_feature_ablation", "internal_influence", "layer_gradcam",
]  # fmt: skip
WITH_DELTA = {"layer_lrp", "layer_integrated_gradients", "layer_conductance",
              "layer_gradient_shap", "layer_deeplift", "layer_deeplift_shap"}  # fmt: skip


class Counting(nn.Sequential):
    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        type(self).calls += 1
        return super().forward(x)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return Counting(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 5), nn.Tanh(), nn.Linear(5, 3)).to(F64)


def _x() -> torch.Tensor:
    return torch.randn(3, 4, dtype=F64, generator=torch.Generator().manual_seed(1))


def _kw(method: str) -> dict[str, Any]:
    kw: dict[str, Any] = {} if method == "layer_activation" else {"target": 0}
    if method in ("layer_gradient_shap", "layer_deeplift_shap"):
        kw["baselines"] = torch.randn(2, 4, dtype=F64, generator=torch.Generator().manual_seed(2))
    if method == "layer_gradient_shap":
        kw["seed"] = 7
    kw["return_convergence_delta"] = method in WITH_DELTA
    return kw


@pytest.mark.parametrize("method", LAYER_METHODS)
def test_each_entry_is_what_that_layer_alone_gives(method: str) -> None:
    m, x = _mlp(), _x()
    many = methods.attribute(m, x, method, layer=LAYERS, **_kw(method))
    assert isinstance(many.attributions, list) and len(many.attributions) == len(LAYERS)
    assert many.params["layer"] == LAYERS
    for i, layer in enumerate(LAYERS):
        one = methods.attribute(m, x, method, layer=layer, **_kw(method))
        torch.testing.assert_close(many.attributions[i], one.attributions, rtol=1e-12, atol=1e-14)
        if method in WITH_DELTA:
            assert isinstance(many.convergence_delta, list)
            torch.testing.assert_close(many.convergence_delta[i], one.convergence_delta)


@pytest.mark.parametrize(
    ("method", "forwards"),
    [("layer_activation", 1), ("layer_gradient_x_activation", 1), ("layer_lrp", 1)],
)
def test_the_reading_methods_take_every_layer_in_one_forward(method: str, forwards: int) -> None:
    m, x = _mlp(), _x()
    Counting.calls = 0
    methods.attribute(m, x, method, layer=LAYERS, **_kw(method))
    assert Counting.calls == forwards


@pytest.mark.parametrize(
    ("ours", "captum"),
    [("layer_activation", LayerActivation), ("layer_gradient_x_activation",
     LayerGradientXActivation), ("layer_lrp", LayerLRP)],
)  # fmt: skip
def test_captum_parity_for_the_one_pass_methods(ours: str, captum: Any) -> None:
    m, x = _mlp(), _x()
    kw = {} if ours == "layer_activation" else {"target": 1}
    ref = captum(m, [m[i] for i in (0, 2, 4)]).attribute(x, **kw)
    got = methods.attribute(m, x, ours, layer=["0", "2", "4"], **kw).attributions
    assert len(got) == len(ref) == 3
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-12)


class Branches(nn.Module):
    """Two branches summed at the output: Captum's joint path and each layer alone agree."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)
        self.head_a, self.head_b = nn.Linear(3, 2), nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_a(torch.tanh(self.a(x))) + self.head_b(torch.sigmoid(self.b(x)))


@pytest.mark.filterwarnings("ignore:Multiple layers provided")
def test_layer_integrated_gradients_matches_captum_on_parallel_layers() -> None:
    torch.manual_seed(0)
    m, x = Branches().to(F64), _x()
    ref = LayerIntegratedGradients(m, [m.a, m.b]).attribute(x, target=1)
    got = methods.attribute(m, x, "layer_integrated_gradients", layer=["a", "b"], target=1)
    for a, b in zip(got.attributions, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.filterwarnings("ignore:Multiple layers provided")
def test_layers_in_sequence_each_get_their_own_integrated_gradients() -> None:
    """Captum interpolates every listed layer at once: an earlier layer's interpolated value is
    overwritten downstream, so it has no gradient and Captum raises; ours are each layer's own
    IG."""
    m, x = _mlp(), _x()
    with pytest.raises(RuntimeError, match="not have been used in the graph"):
        LayerIntegratedGradients(m, [m[0], m[2]]).attribute(x, target=0)
    got = methods.attribute(m, x, "layer_integrated_gradients", layer=["0", "2"], target=0)
    alone = methods.attribute(m, x, "layer_integrated_gradients", layer="0", target=0)
    torch.testing.assert_close(got.attributions[0], alone.attributions)
    assert float(got.attributions[0].abs().max()) > 0


def test_noise_tunnel_and_upsampling_apply_per_layer() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Conv2d(2, 2, 3), nn.Flatten(),
                      nn.Linear(2 * 4 * 4, 2)).to(F64)  # fmt: skip
    x = torch.rand(2, 1, 8, 8, dtype=F64)
    nt = {"nt_type": "smoothgrad", "nt_samples": 3, "stdevs": 0.1}
    kw: dict[str, Any] = {"target": 1, "seed": 3, "noise_tunnel": nt, "interpolate_to_input": True}
    many = methods.attribute(m, x, "layer_gradient_x_activation", layer=["0", "2"], **kw)
    for i, layer in enumerate(["0", "2"]):
        one = methods.attribute(m, x, "layer_gradient_x_activation", layer=layer, **kw)
        assert many.attributions[i].shape == (2, 2, 8, 8)
        torch.testing.assert_close(many.attributions[i], one.attributions)


@pytest.mark.parametrize("layers", [[], ["0", "nope"], ["0", 3]])
def test_a_bad_list_names_layer(layers: list[Any]) -> None:
    with pytest.raises(methods.AttributionError) as e:
        methods.attribute(_mlp(), _x(), "layer_gradient_x_activation", target=0, layer=layers)
    assert e.value.argument == "layer"


def test_activations_are_kept_before_an_in_place_op_changes_them() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True), nn.Linear(4, 3)).to(F64)
    x = _x()
    many = methods.attribute(m, x, "layer_activation", layer=["0", "2"]).attributions
    alone = methods.attribute(m, x, "layer_activation", layer="0").attributions
    assert bool((alone < 0).any())  # the ReLU would have zeroed these
    torch.testing.assert_close(many[0], alone)


def test_a_listed_layer_the_target_does_not_depend_on_is_refused() -> None:
    class Aux(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.aux, self.out = nn.Linear(4, 4), nn.Linear(4, 2), nn.Linear(4, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.aux(x)  # a side branch the output does not use
            return self.out(self.a(x))

    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(Aux().to(F64), _x(), "layer_gradient_x_activation", target=0,
                          layer=["a", "aux"])  # fmt: skip
    assert e.value.argument == "layer" and "'aux'" in str(e.value)


def test_a_layer_listed_twice_is_refused_and_each_layer_costs() -> None:
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(_mlp(), _x(), "layer_conductance", target=0, layer=["0", "2", "0"])
    assert e.value.argument == "layer" and "more than once" in str(e.value)
    from methods import registry
    from methods.cost import CostShape
    from methods.params import parse_params

    ms, shape = registry.get("layer_integrated_gradients"), CostShape(((4,),))
    one = ms.cost(parse_params(ms.params, ms.name, {"layer": "0"}), shape)
    three = ms.cost(parse_params(ms.params, ms.name, {"layer": LAYERS}), shape)
    assert three == 3 * one > 1


def test_export_takes_one_layer() -> None:
    with pytest.raises(methods.AttributionError) as e:
        methods.export(_mlp(), "layer_integrated_gradients", _x(), target=0, layer=["0", "2"])
    assert e.value.argument == "layer"
