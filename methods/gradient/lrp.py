"""Layer-wise Relevance Propagation with Captum's default rules and per-layer overrides.

Bach et al. 2015, https://doi.org/10.1371/journal.pone.0130140. The targeted output is the
relevance that is propagated back to the inputs; linear layers, convolutions, pooling and
batch norm use the epsilon rule (1e-9) unless ``rules`` names another for a module (epsilon,
gamma, alpha1_beta0, z_plus, identity); activations and dropout pass relevance on, and an
addition splits it between its terms in proportion to each (Captum passes all of it to both
terms, doubling it at every residual connection). The rules
act on every *call* (``methods.engine.lrp_rules``), so functional layers and reused modules
are propagated correctly, and the model's weights are never modified.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from pydantic import Field

from methods.engine import layers, lrp_rules
from methods.engine.call import Call, Output
from methods.engine.gradients import gradients
from methods.engine.inputs import Forward, Tensors
from methods.errors import InvalidArgumentError
from methods.params import MethodParams
from methods.registry import TokenCounterpart, register

RULES_DESCRIPTION = (
    "per-module rules: dotted module path -> rule name (epsilon, gamma, alpha1_beta0, z_plus, "
    "identity) or {rule, epsilon, gamma, set_bias_to_zero}; a rule applies to the calls made "
    "inside that module; unnamed modules use epsilon=1e-9. Tensor additions and subtractions "
    "(residual connections) split the relevance between their terms in proportion to each "
    "term (epsilon; z_plus and alpha1_beta0: positive terms only; gamma: positive terms "
    "weighted up) by the rule of the module they run in, or by rules['add'] where the model "
    "has no module of that path"
)


class LRPParams(MethodParams):
    rules: dict[str, Any] | None = Field(None, description=RULES_DESCRIPTION)


def parse_rules(model: Any, rules: dict[str, Any] | None) -> dict[str, lrp_rules.Rule]:
    if not rules:
        return {}
    out = {}
    for path, spec in rules.items():
        if path == lrp_rules.ADD and not lrp_rules.has_module(model, path):
            out[path] = lrp_rules.parse_rule(spec, path)
            continue
        try:
            layers.resolve(model, path)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"rules: {exc}", argument="rules") from None
        out[path] = lrp_rules.parse_rule(spec, path)
    return out


def relevance_forward(call: Call, rules: dict[str, lrp_rules.Rule]) -> Forward:
    """``call.forward`` with relevance propagation rules active while the model runs."""
    fn, model = call.forward.fn, call.model

    def wrapped(*args: Any) -> Any:
        with lrp_rules.lrp(model, rules):
            return fn(*args)

    return dataclasses.replace(call.forward, fn=wrapped)


def scale(relevance: Tensors, output: torch.Tensor) -> Tensors:
    """Relevance for a unit output, times the targeted output (Captum's normalisation)."""
    return tuple(r * output.reshape(-1, *([1] * (r.dim() - 1))).to(r.dtype) for r in relevance)


def conservation_delta(relevance: Tensors, output: torch.Tensor) -> torch.Tensor:
    n = output.shape[0]
    return output.flatten() - sum(r.reshape(n, -1).sum(1) for r in relevance)


@register(
    "lrp",
    family="gradient",
    params=LRPParams,
    needs_hooks=True,
    returns_delta=True,
    token_counterpart=TokenCounterpart("layer_lrp"),
)
def lrp(call: Call, p: LRPParams) -> Output:
    """Relevance of each input element for the targeted output (sums to it, up to epsilon)."""
    forward = relevance_forward(call, parse_rules(call.model, p.rules))
    grads, selected = gradients(forward, call.inputs, call.target)
    relevance = scale(grads, selected)
    return Output(relevance, delta=conservation_delta(relevance, selected), outputs=selected)
