"""Layer and neuron feature ablation: Captum parity (float64) on the model matrix."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import LayerFeatureAblation, NeuronFeatureAblation

import methods
from tests import zoo

CASES = [(c.name, layer) for c in zoo.cases() for layer in c.layers]


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _close(ours: Any, ref: Any) -> None:
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    for a, b in zip(_tuple(ours), _tuple(ref), strict=True):
        torch.testing.assert_close(a, b.detach(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("to_input", [False, True])
@pytest.mark.parametrize(("case", "layer"), CASES)
def test_layer_and_neuron_feature_ablation(case: str, layer: str, to_input: bool) -> None:
    c = zoo.by_name(case)
    mod, args = c.model.get_submodule(layer), c.additional_forward_args
    ours = methods.attribute(
        c.model,
        c.inputs,
        "layer_feature_ablation",
        target=c.target,
        additional_forward_args=args,
        layer=layer,
        attribute_to_layer_input=to_input,
        perturbations_per_eval=3,
    )
    # Captum needs perturbations_per_eval=1 with list targets; the numbers do not depend on it
    ref = LayerFeatureAblation(c.model, mod).attribute(
        c.inputs, target=c.target, additional_forward_args=args, attribute_to_layer_input=to_input
    )
    _close(ours.attributions, ref)
    act = methods.attribute(
        c.model,
        c.inputs,
        "layer_activation",
        layer=layer,
        additional_forward_args=args,
        attribute_to_layer_input=to_input,
    ).attributions
    sel = tuple(min(1, s - 1) for s in act.shape[1:])
    ours = methods.attribute(
        c.model,
        c.inputs,
        "neuron_feature_ablation",
        baselines=c.baselines,
        additional_forward_args=args,
        layer=layer,
        neuron_selector=sel,
        attribute_to_neuron_input=to_input,
        perturbations_per_eval=2,
    )
    ref = NeuronFeatureAblation(c.model, mod).attribute(
        c.inputs,
        sel,
        baselines=c.baselines,
        additional_forward_args=args,
        attribute_to_neuron_input=to_input,
        perturbations_per_eval=2,
    )
    _close(ours.attributions, ref)


def test_layer_feature_ablation_on_token_ids_with_a_layer_mask() -> None:
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 4).double()
    model = torch.nn.Sequential(emb, torch.nn.Flatten(), torch.nn.Linear(12, 2).double())
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    mask = torch.arange(3).view(1, 3, 1).expand(1, 3, 4)  # one feature per token
    ours = methods.attribute(
        model, ids, "layer_feature_ablation", target=0, layer="0", layer_mask=mask
    ).attributions
    ref = LayerFeatureAblation(model, emb).attribute(ids, target=0, layer_mask=mask)
    _close(ours, ref)
