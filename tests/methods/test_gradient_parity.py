"""Captum parity, float64, for every deterministic gradient method on the model matrix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import (
    Deconvolution,
    DeepLift,
    DeepLiftShap,
    GuidedBackprop,
    InputXGradient,
    IntegratedGradients,
    NoiseTunnel,
    Saliency,
)

import methods
from tests import zoo
from tests.methods.test_deeplift_rules import captum_per_example_softmax

#: every test twice, channels-last (rounded as another CPU would) and as given (conftest)
pytestmark = pytest.mark.usefixtures("both_layouts")

CASES = [c.name for c in zoo.cases()]


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _close(ours: Any, ref: Any, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Elementwise closeness; atol is relative to the largest reference magnitude."""
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    for a, b in zip(_tuple(ours), _tuple(ref), strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        b = b.detach()
        scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
        torch.testing.assert_close(a, b.detach(), rtol=rtol, atol=atol * scale)


def _common(c: zoo.Case) -> dict[str, Any]:
    return {"target": c.target, "additional_forward_args": c.additional_forward_args}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("abs_", [True, False])
def test_saliency(case: str, abs_: bool) -> None:
    c = zoo.by_name(case)
    ref = Saliency(c.model).attribute(c.inputs, abs=abs_, **_common(c))
    _close(
        methods.attribute(c.model, c.inputs, "saliency", abs=abs_, **_common(c)).attributions, ref
    )


@pytest.mark.parametrize("case", CASES)
def test_input_x_gradient(case: str) -> None:
    c = zoo.by_name(case)
    ref = InputXGradient(c.model).attribute(c.inputs, **_common(c))
    _close(methods.attribute(c.model, c.inputs, "input_x_gradient", **_common(c)).attributions, ref)


# Captum rounds step weights (and Riemann alphas) through float32: ~1e-8 relative differences.
IG_RTOL = 1e-6
IG_ATOL = 1e-6  # relative to the largest magnitude, see _close


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "approx", ["gausslegendre", "riemann_left", "riemann_right", "riemann_middle"]
)
@pytest.mark.parametrize("n_steps", [1, 7, 50])
def test_integrated_gradients(case: str, approx: str, n_steps: int) -> None:
    if n_steps == 1 and approx != "gausslegendre":
        pytest.skip("Captum requires n_steps > 1 for Riemann rules")
    c = zoo.by_name(case)
    ref, ref_delta = IntegratedGradients(c.model).attribute(
        c.inputs, baselines=c.baselines, n_steps=n_steps, method=approx,
        return_convergence_delta=True, **_common(c),
    )  # fmt: skip
    res = methods.attribute(
        c.model, c.inputs, "integrated_gradients", baselines=c.baselines, n_steps=n_steps,
        approximation_method=approx, return_convergence_delta=True, **_common(c),
    )  # fmt: skip
    _close(res.attributions, ref, rtol=IG_RTOL, atol=IG_ATOL)
    torch.testing.assert_close(res.convergence_delta, ref_delta, rtol=IG_RTOL, atol=1e-6)


@pytest.mark.parametrize("case", ["mlp", "two_input", "cnn"])
def test_integrated_gradients_trapezoid_is_captum_times_n_over_n_minus_1(case: str) -> None:
    c = zoo.by_name(case)
    n = 50
    ref = IntegratedGradients(c.model).attribute(
        c.inputs, baselines=c.baselines, n_steps=n, method="riemann_trapezoid", **_common(c)
    )
    ours = methods.attribute(
        c.model, c.inputs, "integrated_gradients", baselines=c.baselines, n_steps=n,
        approximation_method="riemann_trapezoid", **_common(c),
    ).attributions  # fmt: skip
    _close(ours, tuple(r * n / (n - 1) for r in _tuple(ref)) if isinstance(ref, tuple)
           else ref * n / (n - 1), rtol=IG_RTOL, atol=IG_ATOL)  # fmt: skip


@pytest.mark.parametrize("case", ["mlp", "two_input"])
@pytest.mark.parametrize("ibs", [1, 5, 13, "auto"])
def test_integrated_gradients_chunking_does_not_change_the_answer(case: str, ibs: Any) -> None:
    c = zoo.by_name(case)
    whole = methods.attribute(c.model, c.inputs, "integrated_gradients", n_steps=20, **_common(c))
    chunked = methods.attribute(
        c.model, c.inputs, "integrated_gradients", n_steps=20, internal_batch_size=ibs,
        **_common(c),
    )  # fmt: skip
    _close(chunked.attributions, whole.attributions, rtol=1e-12)


@pytest.mark.parametrize("case", CASES)
def test_integrated_gradients_without_multiplying_by_inputs(case: str) -> None:
    c = zoo.by_name(case)
    ref = IntegratedGradients(c.model, multiply_by_inputs=False).attribute(
        c.inputs, n_steps=10, **_common(c)
    )
    ours = methods.attribute(
        c.model, c.inputs, "integrated_gradients", n_steps=10, multiply_by_inputs=False,
        **_common(c),
    )  # fmt: skip
    _close(ours.attributions, ref, rtol=IG_RTOL, atol=IG_ATOL)


class _SeparatedCNN(zoo.CNN):
    """zoo.CNN with its ReLU and MaxPool separated by a no-op, so Captum's hooks chain."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)) * 1)
        x = self.pool2(self.act2(self.conv2(x)))
        return self.fc(x.flatten(1))


def _captum_model(c: zoo.Case) -> torch.nn.Module:
    """The model Captum gets: for the CNN (a ReLU feeding a MaxPool, where Captum's chain
    breaks, see test_deeplift_adjacent_nonlinearities_chain) its separated twin."""
    if c.name != "cnn":
        return c.model
    twin = _SeparatedCNN().double().eval()
    twin.load_state_dict(c.model.state_dict())
    return twin


DEEPLIFT_CASES = [c for c in CASES if c != "conv_twin"]  # conv_twin: checked separately


@pytest.mark.parametrize("case", DEEPLIFT_CASES)
@pytest.mark.parametrize("mbi", [True, False])
def test_deeplift(case: str, mbi: bool) -> None:
    c = zoo.by_name(case)
    with captum_per_example_softmax():  # our softmax rule (README); module_twin
        ref, ref_delta = DeepLift(_captum_model(c), multiply_by_inputs=mbi).attribute(
            c.inputs, baselines=c.baselines, return_convergence_delta=True, **_common(c)
        )
    res = methods.attribute(
        c.model, c.inputs, "deeplift", baselines=c.baselines, multiply_by_inputs=mbi,
        return_convergence_delta=True, **_common(c),
    )  # fmt: skip
    _close(res.attributions, ref)
    torch.testing.assert_close(res.convergence_delta, ref_delta, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("case", DEEPLIFT_CASES)
def test_deeplift_shap(case: str) -> None:
    c = zoo.by_name(case)
    g = torch.Generator().manual_seed(5)
    xs = _tuple(c.inputs)
    dist = tuple(torch.randn((3, *x.shape[1:]), generator=g, dtype=x.dtype) for x in xs)
    base = dist if isinstance(c.inputs, tuple) else dist[0]
    with captum_per_example_softmax():  # our softmax rule (README); module_twin
        ref, ref_delta = DeepLiftShap(_captum_model(c)).attribute(
            c.inputs, baselines=base, return_convergence_delta=True, **_common(c)
        )
    res = methods.attribute(
        c.model, c.inputs, "deeplift_shap", baselines=base, return_convergence_delta=True,
        **_common(c),
    )  # fmt: skip
    _close(res.attributions, ref)
    torch.testing.assert_close(res.convergence_delta, ref_delta, rtol=1e-9, atol=1e-9)


def test_deeplift_adjacent_nonlinearities_chain() -> None:
    """ReLU feeding MaxPool: Captum's hooks on the shared tensor see the plain gradient, so
    the max rule's multipliers never reach the ReLU. Ours chains the rules; it equals Captum
    on the same model with the two non-linearities separated by a no-op (x * 1)."""
    c = zoo.by_name("conv_twin")
    separated = zoo.ConvModuleTwin().double().eval()
    separated.load_state_dict(c.model.state_dict())

    def forward(x: torch.Tensor) -> torch.Tensor:
        m = separated
        return m.fc(m.pool(m.relu(m.conv(x)) * 1).flatten(1))

    separated.forward = forward  # type: ignore[method-assign]
    ref = DeepLift(separated).attribute(c.inputs, target=c.target)
    ours = methods.attribute(c.model, c.inputs, "deeplift", target=c.target).attributions
    _close(ours, ref)
    broken = DeepLift(c.model).attribute(c.inputs, target=c.target)
    assert (broken - ours).abs().max() > 1e-3  # Captum's own answer on the plain model differs


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["guided_backprop", "deconvolution"])
def test_guided_backprop_and_deconvolution(case: str, name: str) -> None:
    c = zoo.by_name(case)
    cls = GuidedBackprop if name == "guided_backprop" else Deconvolution
    ref = cls(c.model).attribute(c.inputs, **_common(c))
    _close(methods.attribute(c.model, c.inputs, name, **_common(c)).attributions, ref)


@pytest.mark.parametrize("nt_type", ["smoothgrad", "smoothgrad_sq", "vargrad"])
def test_noise_tunnel_without_noise_matches_captum(nt_type: str) -> None:
    c = zoo.by_name("two_input")
    ref = NoiseTunnel(IntegratedGradients(c.model)).attribute(
        c.inputs, nt_type=nt_type, nt_samples=4, nt_samples_batch_size=3, stdevs=0.0,
        n_steps=8, **_common(c),
    )  # fmt: skip
    ours = methods.attribute(
        c.model, c.inputs, "integrated_gradients", n_steps=8, **_common(c),
        noise_tunnel={"nt_type": nt_type, "nt_samples": 4, "nt_samples_batch_size": 3,
                      "stdevs": 0.0},
    ).attributions  # fmt: skip
    _close(ours, ref, rtol=IG_RTOL, atol=IG_ATOL)


@pytest.mark.parametrize("case", ["mlp", "cnn", "two_input"])
@pytest.mark.parametrize(
    "name", ["saliency", "input_x_gradient", "integrated_gradients", "deeplift", "guided_backprop"]
)
def test_functional_twin_equals_module_twin(case: str, name: str) -> None:
    del case
    for module_model, functional_model, x, target in zoo.twins():
        a = methods.attribute(module_model, x, name, target=target).attributions
        b = methods.attribute(functional_model, x, name, target=target).attributions
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


class _InPlace(torch.nn.Module):
    """In-place non-linearities, as modules and as tensor methods."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = torch.nn.Linear(4, 6)
        self.act = torch.nn.ReLU(inplace=True)
        self.l2 = torch.nn.Linear(6, 6)
        self.elu = torch.nn.ELU(inplace=True)
        self.l3 = torch.nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l3(self.elu(self.l2(self.act(self.l1(x)))))


class _InPlaceMethods(_InPlace):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.l1(x)
        h.relu_()
        return self.l3(self.elu(self.l2(h)))


@pytest.mark.parametrize("name", ["deeplift", "guided_backprop", "deconvolution"])
def test_in_place_non_linearities(name: str) -> None:
    torch.manual_seed(4)
    module_model = _InPlace().double().eval()
    method_model = _InPlaceMethods().double().eval()
    method_model.load_state_dict(module_model.state_dict())
    x = torch.randn(3, 4, dtype=torch.float64)
    cls = {"deeplift": DeepLift, "guided_backprop": GuidedBackprop,
           "deconvolution": Deconvolution}[name]  # fmt: skip
    ref = cls(module_model).attribute(x, target=1)
    _close(methods.attribute(module_model, x, name, target=1).attributions, ref)
    _close(methods.attribute(method_model, x, name, target=1).attributions, ref)
