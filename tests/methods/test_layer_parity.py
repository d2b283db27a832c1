"""Captum parity, float64, for the deterministic layer methods on the model matrix, both
``attribute_to_layer_input`` values, plus Captum's oracle values (captum-reference §4.3)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import (
    GuidedGradCam,
    InternalInfluence,
    LayerActivation,
    LayerConductance,
    LayerDeepLift,
    LayerDeepLiftShap,
    LayerGradCam,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    LayerLRP,
)

import methods
from tests import zoo
from tests.captum_models import ConvNetOneConv, MultiLayer
from tests.methods.test_deeplift_rules import captum_per_example_softmax

#: every test twice, channels-last (rounded as another CPU would) and as given (conftest)
pytestmark = pytest.mark.usefixtures("both_layouts")

LAYER_CASES = [(c.name, layer) for c in zoo.cases() for layer in c.layers]
#: Captum's DeepLift breaks the rescale chain where nn.ReLU feeds nn.MaxPool directly; these
#: (case, layer) pairs have that chain on the backward path, so completeness is checked instead.
RELU_MAXPOOL_CHAIN = {("cnn", "conv1"), ("cnn", "pool1"), ("conv_twin", "conv")}
#: Captum's LRP has no rule for nn.Sigmoid / nn.Softmax and raises.
NO_CAPTUM_LRP = {"two_input", "module_twin"}
IG_RTOL = 1e-6  # Captum rounds alphas and weights through float32


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _close(ours: Any, ref: Any, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    for a, b in zip(_tuple(ours), _tuple(ref), strict=True):
        b = b.detach()
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = max(1.0, float(b.abs().max()))
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale)


def _run(c: zoo.Case, name: str, layer: str, to_input: bool, **kw: Any) -> methods.Result:
    return methods.attribute(
        c.model,
        c.inputs,
        name,
        layer=layer,
        attribute_to_layer_input=to_input,
        additional_forward_args=c.additional_forward_args,
        **kw,
    )


def _dist(c: zoo.Case) -> Any:
    g = torch.Generator().manual_seed(5)
    d = tuple(torch.randn((3, *x.shape[1:]), generator=g, dtype=x.dtype) for x in _tuple(c.inputs))
    return d if isinstance(c.inputs, tuple) else d[0]


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), LAYER_CASES)
def test_gradient_layer_methods(case: str, layer: str, to_input: bool) -> None:
    c = zoo.by_name(case)
    mod = c.model.get_submodule(layer)
    common = {
        "additional_forward_args": c.additional_forward_args,
        "attribute_to_layer_input": to_input,
    }
    ref = LayerActivation(c.model, mod).attribute(c.inputs, **common)
    _close(_run(c, "layer_activation", layer, to_input).attributions, ref)
    for mbi in (True, False):
        ref = LayerGradientXActivation(c.model, mod, multiply_by_inputs=mbi).attribute(
            c.inputs, target=c.target, **common
        )
        ours = _run(
            c,
            "layer_gradient_x_activation",
            layer,
            to_input,
            target=c.target,
            multiply_by_inputs=mbi,
        )
        _close(ours.attributions, ref)
    for relu, summ in ((False, True), (True, False)):
        ref = LayerGradCam(c.model, mod).attribute(
            c.inputs, target=c.target, relu_attributions=relu, attr_dim_summation=summ, **common
        )
        ours = _run(
            c,
            "layer_gradcam",
            layer,
            to_input,
            target=c.target,
            relu_attributions=relu,
            attr_dim_summation=summ,
        )
        _close(ours.attributions, ref)


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), LAYER_CASES)
def test_path_layer_methods(case: str, layer: str, to_input: bool) -> None:
    c = zoo.by_name(case)
    mod = c.model.get_submodule(layer)
    common = {
        "additional_forward_args": c.additional_forward_args,
        "attribute_to_layer_input": to_input,
        "baselines": c.baselines,
        "target": c.target,
    }
    ref, ref_delta = LayerIntegratedGradients(c.model, mod).attribute(
        c.inputs, n_steps=20, return_convergence_delta=True, **common
    )
    ours = _run(
        c,
        "layer_integrated_gradients",
        layer,
        to_input,
        n_steps=20,
        target=c.target,
        baselines=c.baselines,
        return_convergence_delta=True,
    )
    _close(ours.attributions, ref, rtol=IG_RTOL, atol=1e-8)
    torch.testing.assert_close(ours.convergence_delta, ref_delta, rtol=IG_RTOL, atol=1e-6)

    ref = InternalInfluence(c.model, mod).attribute(c.inputs, n_steps=12, **common)
    ours = _run(
        c,
        "internal_influence",
        layer,
        to_input,
        n_steps=12,
        target=c.target,
        baselines=c.baselines,
        internal_batch_size=7,
    )
    _close(ours.attributions, ref, rtol=IG_RTOL, atol=1e-8)

    ref, ref_delta = LayerConductance(c.model, mod).attribute(
        c.inputs, n_steps=12, return_convergence_delta=True, **common
    )
    ours = _run(
        c,
        "layer_conductance",
        layer,
        to_input,
        n_steps=12,
        target=c.target,
        baselines=c.baselines,
        return_convergence_delta=True,
    )
    _close(ours.attributions, ref, rtol=IG_RTOL, atol=1e-8)
    torch.testing.assert_close(ours.convergence_delta, ref_delta, rtol=IG_RTOL, atol=1e-6)


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), LAYER_CASES)
def test_layer_deeplift_and_shap(case: str, layer: str, to_input: bool) -> None:
    c = zoo.by_name(case)
    mod = c.model.get_submodule(layer)
    common = {
        "additional_forward_args": c.additional_forward_args,
        "attribute_to_layer_input": to_input,
        "target": c.target,
    }
    for name, cls, bl in (
        ("layer_deeplift", LayerDeepLift, c.baselines),
        ("layer_deeplift_shap", LayerDeepLiftShap, _dist(c)),
    ):
        ours = _run(
            c, name, layer, to_input, target=c.target, baselines=bl, return_convergence_delta=True
        )
        if (case, layer) in RELU_MAXPOOL_CHAIN:
            # Captum's numbers are wrong here; ours are complete: sum = f(x) - f(b)
            torch.testing.assert_close(
                ours.convergence_delta, torch.zeros_like(ours.convergence_delta), rtol=0, atol=1e-9
            )
            continue
        with captum_per_example_softmax():  # our softmax rule (README); module_twin
            ref, ref_delta = cls(c.model, mod).attribute(
                c.inputs, baselines=bl, return_convergence_delta=True, **common
            )
        _close(ours.attributions, ref)
        torch.testing.assert_close(ours.convergence_delta, ref_delta, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), LAYER_CASES)
def test_layer_lrp(case: str, layer: str, to_input: bool) -> None:
    if case in NO_CAPTUM_LRP:
        pytest.skip("Captum has no LRP rule for this model's modules")
    c = zoo.by_name(case)
    ref, ref_delta = LayerLRP(c.model, c.model.get_submodule(layer)).attribute(
        c.inputs,
        target=c.target,
        additional_forward_args=c.additional_forward_args,
        attribute_to_layer_input=to_input,
        return_convergence_delta=True,
    )
    ours = _run(c, "layer_lrp", layer, to_input, target=c.target, return_convergence_delta=True)
    _close(ours.attributions, ref)
    torch.testing.assert_close(ours.convergence_delta, ref_delta, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layer", ["conv1", "pool1", "conv2"])
@pytest.mark.parametrize("to_input", [False, True])
def test_guided_gradcam(layer: str, to_input: bool) -> None:
    c = zoo.by_name("cnn")
    ref = GuidedGradCam(c.model, c.model.get_submodule(layer)).attribute(
        c.inputs, target=c.target, attribute_to_layer_input=to_input
    )
    ours = methods.attribute(
        c.model,
        c.inputs,
        "guided_gradcam",
        target=c.target,
        layer=layer,
        attribute_to_layer_input=to_input,
    )
    _close(ours.attributions, ref)


# --- Captum's oracle values (captum-reference §4.3, cases 16 and 19)


def test_gradcam_oracle_convnet() -> None:
    m, ci = ConvNetOneConv().double(), torch.arange(16.0, dtype=torch.float64).view(1, 1, 4, 4)
    r = methods.attribute(m, ci, "layer_gradcam", target=0, layer="conv1").attributions
    torch.testing.assert_close(
        r, torch.tensor([[[[11.25, 13.5], [20.25, 22.5]]]], dtype=torch.float64)
    )
    r = methods.attribute(m, ci, "layer_gradcam", target=0, layer="relu1").attributions
    torch.testing.assert_close(r, torch.tensor([[[[0.0, 4.0], [28.0, 32.5]]]], dtype=torch.float64))
    r = methods.attribute(m, ci, "guided_gradcam", target=0, layer="conv1").attributions
    want = [
        [0, 11.25, 13.5, 13.5],
        [11.25, 33.75, 40.5, 27],
        [20.25, 60.75, 67.5, 45],
        [20.25, 40.5, 45, 22.5],
    ]
    torch.testing.assert_close(r, torch.tensor(want, dtype=torch.float64).view(1, 1, 4, 4))


def test_layer_oracles_multilayer() -> None:
    m, x = MultiLayer().double(), torch.tensor([[0.0, 100.0, 0.0]], dtype=torch.float64)

    def run(name: str, **kw: Any) -> methods.Result:
        return methods.attribute(m, x, name, target=0, layer="linear1", **kw)

    t = lambda v: torch.tensor([v], dtype=torch.float64)  # noqa: E731
    torch.testing.assert_close(
        run("layer_conductance", n_steps=500).attributions,
        t([89.9945, 99.9989, 99.9989, 99.9989]),
        atol=1e-3,
        rtol=0,
    )
    torch.testing.assert_close(
        run("internal_influence").attributions, t([0.901794, 1, 1, 1]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        run("layer_integrated_gradients").attributions,
        t([90.179367, 100, 100, 100]),
        atol=1e-4,
        rtol=0,
    )
    torch.testing.assert_close(
        run("layer_gradient_x_activation").attributions, t([90, 101, 101, 101])
    )
    res = run("layer_deeplift", return_convergence_delta=True)
    torch.testing.assert_close(res.attributions, t([90, 100, 100, 100]))
    assert float(res.convergence_delta.abs().max()) < 1e-9
    r = methods.attribute(m, x, "layer_activation", layer="linear1").attributions
    torch.testing.assert_close(r, t([90, 101, 101, 101]))
