"""The layer engine: path resolution, errors, tuple layers, hook hygiene, completeness."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from captum.attr import LayerGradientXActivation, LayerIntegratedGradients
from torch import nn

import methods
from tests import zoo


class TwoOut(nn.Module):
    """A layer returning a tuple, and a layer taking two tensors."""

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return h.relu(), h.tanh()


class Join(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * 2 + b


class TupleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 5)
        self.split = TwoOut()
        self.join = Join()
        self.out = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.split(self.lin(x))
        return self.out(self.join(a, b))


class Reused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.lin(x)).sum(1)


def _tuple_model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(1)
    return TupleModel().double(), torch.randn(3, 4, dtype=torch.float64)


def test_unknown_layer_lists_the_nearest_names() -> None:
    c = zoo.by_name("cnn")
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(c.model, c.inputs, "layer_activation", layer="conv_1")
    assert e.value.argument == "layer"
    assert "conv1" in str(e.value)


def test_layer_methods_need_a_module() -> None:
    c = zoo.by_name("mlp")
    with pytest.raises(methods.UnsupportedModelError) as e:
        methods.attribute(lambda x: c.model(x), c.inputs, "layer_gradcam", target=0, layer="net.0")
    assert e.value.argument == "layer"


def test_reused_layer_is_an_error_not_a_silent_last_call() -> None:
    m = Reused().double()
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(
            m, torch.ones(2, 3, dtype=torch.float64), "layer_gradient_x_activation", layer="lin"
        )
    assert "2 times" in str(e.value)
    assert not m.lin._forward_hooks


def test_layer_that_does_not_run() -> None:
    m, x = _tuple_model()
    m.unused = nn.Linear(1, 1).double()
    with pytest.raises(methods.InvalidArgumentError, match="did not run"):
        methods.attribute(m, x, "layer_activation", layer="unused")


@pytest.mark.parametrize("to_input", [False, True])
def test_tuple_layers_return_tuples_like_captum(to_input: bool) -> None:
    m, x = _tuple_model()
    layer = "split" if not to_input else "join"
    ours = methods.attribute(
        m,
        x,
        "layer_gradient_x_activation",
        target=1,
        layer=layer,
        attribute_to_layer_input=to_input,
    ).attributions
    ref = LayerGradientXActivation(m, m.get_submodule(layer)).attribute(
        x, target=1, attribute_to_layer_input=to_input
    )
    assert isinstance(ours, tuple) and isinstance(ref, tuple) and len(ours) == 2
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b.detach())
    ours = methods.attribute(
        m,
        x,
        "layer_integrated_gradients",
        target=1,
        layer=layer,
        attribute_to_layer_input=to_input,
        n_steps=10,
    ).attributions
    ref = LayerIntegratedGradients(m, m.get_submodule(layer)).attribute(
        x, target=1, attribute_to_layer_input=to_input, n_steps=10
    )
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-8)
    single = methods.attribute(m, x, "layer_activation", layer="lin").attributions
    assert isinstance(single, torch.Tensor)


@pytest.mark.parametrize("case", ["mlp", "cnn", "conv_twin"])
def test_layer_ig_completeness(case: str) -> None:
    c = zoo.by_name(case)
    r = methods.attribute(
        c.model,
        c.inputs,
        "layer_integrated_gradients",
        target=c.target,
        layer=c.layers[0],
        n_steps=300,
        return_convergence_delta=True,
    )
    with torch.no_grad():
        fx = c.model(c.inputs)
    scale = float(fx.abs().max())
    assert (
        float(r.convergence_delta.abs().max()) < 1e-2 * scale
    )  # kinks (ReLU, max-pool) slow quadrature down


LAYER_AND_NEURON = [
    s
    for s in methods.available()
    if s.kind in ("layer", "neuron") or s.name in ("lrp", "guided_gradcam")
]


def _kw(name: str) -> dict[str, Any]:
    kw: dict[str, Any] = {"target": 1}
    if (
        name.startswith("layer")
        or name.startswith("neuron")
        or name
        in (
            "internal_influence",
            "guided_gradcam",
        )
    ):
        kw["layer"] = "conv2"
    if name.startswith("neuron"):
        kw.pop("target")
        kw["neuron_selector"] = (1, 1, 1)
        if name == "neuron_conductance":
            kw["target"] = 1
    if name.endswith("shap"):
        kw["baselines"] = torch.zeros(2, 3, 8, 8, dtype=torch.float64)
    if "n_steps" in next(s for s in LAYER_AND_NEURON if s.name == name).params["properties"]:
        kw["n_steps"] = 4
    return kw


@pytest.mark.parametrize("info", LAYER_AND_NEURON, ids=[s.name for s in LAYER_AND_NEURON])
def test_no_hooks_or_weight_changes_left_when_the_forward_raises_after_the_layer(info: Any) -> None:
    c = zoo.by_name("cnn")
    state = {k: v.clone() for k, v in c.model.state_dict().items()}

    def boom(m: nn.Module, a: Any) -> None:
        raise RuntimeError("late failure")

    handle = c.model.fc.register_forward_pre_hook(boom)
    try:
        counts = [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in c.model.modules()
        ]
        with contextlib.suppress(methods.ModelError):
            methods.attribute(c.model, c.inputs, info.name, **_kw(info.name))
        after = [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in c.model.modules()
        ]
        assert after == counts
        for k, v in c.model.state_dict().items():
            assert torch.equal(v, state[k])
    finally:
        handle.remove()
