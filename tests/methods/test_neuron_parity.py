"""Captum parity, float64, for the deterministic neuron methods on the model matrix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import (
    NeuronConductance,
    NeuronDeconvolution,
    NeuronDeepLift,
    NeuronDeepLiftShap,
    NeuronGradient,
    NeuronGuidedBackprop,
    NeuronIntegratedGradients,
)

import methods
from tests import zoo
from tests.captum_models import MultiLayer

#: every test twice, channels-last (rounded as another CPU would) and as given (conftest)
pytestmark = pytest.mark.usefixtures("both_layouts")

#: layers whose neuron Captum cannot differentiate w.r.t. every input (it raises; ours gives 0)
CAPTUM_RAISES = {("two_input", "a")}
#: Captum's DeepLift breaks the rescale chain where nn.ReLU feeds nn.MaxPool directly
RELU_MAXPOOL_CHAIN = {("cnn", "pool1"), ("cnn", "conv2")}
CASES = [(c.name, layer) for c in zoo.cases() for layer in c.layers]
IG_RTOL = 1e-6


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _close(ours: Any, ref: Any, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    for a, b in zip(_tuple(ours), _tuple(ref), strict=True):
        b = b.detach()
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * max(1.0, float(b.abs().max())))


def _selector(c: zoo.Case, layer: str, to_input: bool) -> Any:
    act = methods.attribute(
        c.model,
        c.inputs,
        "layer_activation",
        layer=layer,
        additional_forward_args=c.additional_forward_args,
        attribute_to_layer_input=to_input,
    ).attributions
    sel = tuple(min(1, s - 1) for s in act.shape[1:])
    return sel[0] if len(sel) == 1 else sel


def _dist(c: zoo.Case) -> Any:
    g = torch.Generator().manual_seed(5)
    d = tuple(torch.randn((3, *x.shape[1:]), generator=g, dtype=x.dtype) for x in _tuple(c.inputs))
    return d if isinstance(c.inputs, tuple) else d[0]


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), CASES)
def test_neuron_methods(case: str, layer: str, to_input: bool) -> None:
    c = zoo.by_name(case)
    mod, sel = c.model.get_submodule(layer), _selector(c, layer, to_input)
    args = c.additional_forward_args

    def ours(name: str, **kw: Any) -> Any:
        return methods.attribute(
            c.model,
            c.inputs,
            name,
            layer=layer,
            neuron_selector=sel,
            attribute_to_neuron_input=to_input,
            additional_forward_args=args,
            **kw,
        ).attributions

    if (case, layer) in CAPTUM_RAISES:
        g = ours("neuron_gradient")
        assert torch.count_nonzero(g[1]) == 0  # x2 does not reach the neuron
        return
    common = {"additional_forward_args": args, "attribute_to_neuron_input": to_input}
    _close(ours("neuron_gradient"), NeuronGradient(c.model, mod).attribute(c.inputs, sel, **common))
    _close(
        ours("neuron_guided_backprop"),
        NeuronGuidedBackprop(c.model, mod).attribute(c.inputs, sel, **common),
    )
    _close(
        ours("neuron_deconvolution"),
        NeuronDeconvolution(c.model, mod).attribute(c.inputs, sel, **common),
    )
    ref = NeuronIntegratedGradients(c.model, mod).attribute(
        c.inputs, sel, baselines=c.baselines, n_steps=16, **common
    )
    _close(
        ours(
            "neuron_integrated_gradients", baselines=c.baselines, n_steps=16, internal_batch_size=9
        ),
        ref,
        rtol=IG_RTOL,
        atol=1e-8,
    )
    ref = NeuronConductance(c.model, mod).attribute(
        c.inputs,
        sel,
        baselines=c.baselines,
        target=c.target,
        n_steps=12,
        method="gausslegendre",
        **common,
    )
    _close(
        ours(
            "neuron_conductance",
            baselines=c.baselines,
            target=c.target,
            n_steps=12,
            approximation_method="gausslegendre",
        ),
        ref,
        rtol=IG_RTOL,
        atol=1e-8,
    )
    if (case, layer) not in RELU_MAXPOOL_CHAIN:
        ref = NeuronDeepLift(c.model, mod).attribute(c.inputs, sel, baselines=c.baselines, **common)
        _close(ours("neuron_deeplift", baselines=c.baselines), ref)
        dist = _dist(c)
        ref = NeuronDeepLiftShap(c.model, mod).attribute(c.inputs, sel, baselines=dist, **common)
        _close(ours("neuron_deeplift_shap", baselines=dist), ref)


def test_neuron_conductance_trapezoid_is_captums_times_n_over_n_minus_1() -> None:
    c = zoo.by_name("mlp")
    n = 10
    ref = NeuronConductance(c.model, c.model.net[2]).attribute(
        c.inputs, 3, target=c.target, n_steps=n
    )
    ours = methods.attribute(
        c.model,
        c.inputs,
        "neuron_conductance",
        layer="net.2",
        neuron_selector=3,
        target=c.target,
        n_steps=n,
    ).attributions
    torch.testing.assert_close(ours, ref * n / (n - 1), rtol=1e-6, atol=1e-9)


def test_neuron_deeplift_complete_where_captum_breaks_the_chain() -> None:
    c = zoo.by_name("cnn")
    dist = _dist(c)
    sel = (1, 1, 1)
    r = methods.attribute(
        c.model,
        c.inputs,
        "neuron_deeplift_shap",
        baselines=dist,
        layer="pool1",
        neuron_selector=sel,
    ).attributions

    def act(x: torch.Tensor) -> torch.Tensor:
        out = methods.attribute(c.model, x, "layer_activation", layer="pool1").attributions
        return out[:, 1, 1, 1]

    want = (act(c.inputs)[:, None] - act(dist)[None, :]).mean(1)
    torch.testing.assert_close(r.flatten(1).sum(1), want, rtol=1e-10, atol=1e-10)


def test_selectors_int_tuple_slice_and_callable() -> None:
    m, x = (
        MultiLayer().double(),
        torch.tensor([[0.0, 100.0, 0.0], [1.0, 2.0, 3.0]], dtype=torch.float64),
    )

    def run(sel: Any, name: str = "neuron_gradient", **kw: Any) -> torch.Tensor:
        return methods.attribute(
            m, x, name, layer="linear1", neuron_selector=sel, **kw
        ).attributions

    torch.testing.assert_close(run(1), run((1,)))
    torch.testing.assert_close(run((slice(1, 3),)), run(1) + run(2))
    torch.testing.assert_close(run(lambda out: out[:, 1] + out[:, 2]), run(1) + run(2))
    nig = run(1, "neuron_integrated_gradients")
    torch.testing.assert_close(nig[:1], torch.tensor([[0.0, 100.0, 0.0]], dtype=torch.float64))
    with pytest.raises(methods.InvalidArgumentError) as e:
        run(7)
    assert e.value.argument == "neuron_selector"
    with pytest.raises(methods.InvalidArgumentError):
        run(lambda out: out)  # not one value per example
    with pytest.raises(methods.InvalidArgumentError):
        run("x")


def test_neuron_conductance_oracle() -> None:
    m, x = MultiLayer().double(), torch.tensor([[0.0, 100.0, 0.0]], dtype=torch.float64)
    r = methods.attribute(
        m, x, "neuron_conductance", layer="linear1", neuron_selector=3, target=0
    ).attributions
    # Captum's 97.999985 is 98 x float32 rounding; ours is the true trapezoid: x 50/49
    torch.testing.assert_close(
        r, torch.tensor([[0.0, 100.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-4
    )


AGGREGATE_CASES = {
    "neuron_gradient": "NeuronGradient",
    "neuron_integrated_gradients": "NeuronIntegratedGradients",
    "neuron_guided_backprop": "NeuronGuidedBackprop",
    "neuron_deconvolution": "NeuronDeconvolution",
    "neuron_gradient_shap": "NeuronGradientShap",
    "neuron_deeplift": "NeuronDeepLift",
    "neuron_deeplift_shap": "NeuronDeepLiftShap",
    "neuron_feature_ablation": "NeuronFeatureAblation",
}


@pytest.mark.parametrize("name", sorted(AGGREGATE_CASES))
@pytest.mark.parametrize("aggregate", ["sum", "mean"])
def test_a_selector_aggregating_the_batch_gives_captums_numbers(name: str, aggregate: str) -> None:
    """Captum's aggregate form, ``lambda out: out.sum()``: one value for the whole batch
    (CONTRACT §7.7; issue 22 defect 4, a raw IndexError before)."""
    import captum.attr

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).double()
    x = torch.randn(3, 3, dtype=torch.float64)

    def sel(out: torch.Tensor) -> torch.Tensor:
        return getattr(out[:, 1:], aggregate)()

    kw: dict[str, Any] = {}
    if name.endswith("_shap"):
        kw["baselines"] = torch.randn(2, 3, dtype=torch.float64)
    ours = methods.attribute(m, x, name, layer="1", neuron_selector=sel, seed=3, **kw)
    if name == "neuron_gradient_shap":  # random points, drawn otherwise than Captum's
        per_row = methods.attribute(
            m, x, name, layer="1", neuron_selector=lambda o: o[:, 1:].sum(1), seed=3, **kw
        )
        scale = 1.0 if aggregate == "sum" else 1 / (x.shape[0] * 5 * 3)  # rows x n_samples
        _close(ours.attributions, per_row.attributions * scale)
        return
    ref = getattr(captum.attr, AGGREGATE_CASES[name])(m, m[1]).attribute(
        x, neuron_selector=sel, **kw
    )
    _close(ours.attributions, ref, rtol=IG_RTOL if "integrated" in name else 1e-10)


def test_neuron_conductance_refuses_a_selector_aggregating_the_batch() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(
            m, torch.randn(2, 3), "neuron_conductance", target=0, layer="1",
            neuron_selector=lambda out: out.sum(),
        )  # fmt: skip
    assert e.value.argument == "neuron_selector"
    assert "one value for the whole batch" in str(e.value)
