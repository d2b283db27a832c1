"""Layer-wise relevance propagation rules, applied per *call* without touching the weights.

Bach et al. 2015, https://doi.org/10.1371/journal.pone.0130140; Montavon et al. 2019
(the epsilon, gamma and z-plus rules). Relevance is propagated as a modified gradient: every
linear-like call (``F.linear``, convolutions, pooling, batch norm) is replaced, while the
model runs, by an autograd function whose forward value is unchanged and whose backward is

    grad_in = a * vjp(f'(a), grad_out / (f'(a) + eps * sign(f'(a))))

where ``a`` is the call's input and ``f'`` the call with the rule's modified weights (gamma:
W + gamma W+; alpha1_beta0 and z_plus: W+), exactly Captum's two-pass hook construction.
Element-wise activations and dropout pass relevance on unchanged. Nothing is written to the
model: modified weights are temporaries of the backward pass, so nothing needs restoring.

Which rule applies to a call is decided by the innermost running module that has one in
``rules`` (dotted path -> rule); other calls get Captum's default, epsilon = 1e-9.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from methods.engine import intercept
from methods.engine.intercept import Composite, Site
from methods.errors import InvalidArgumentError

RULE_NAMES = ("epsilon", "gamma", "alpha1_beta0", "z_plus", "identity")


@dataclass(frozen=True)
class Rule:
    """One propagation rule (Captum's EpsilonRule, GammaRule, Alpha1_Beta0_Rule,
    IdentityRule; z_plus = Alpha1_Beta0 with the bias set to zero)."""

    name: str = "epsilon"
    epsilon: float = 1e-9
    gamma: float = 0.25
    set_bias_to_zero: bool = False

    def weight(self, w: Tensor | None) -> Tensor | None:
        if w is None:
            return None
        if self.name == "gamma":
            return w + self.gamma * w.clamp(min=0)
        if self.name in ("alpha1_beta0", "z_plus"):
            return w.clamp(min=0)
        return w

    def bias(self, b: Tensor | None) -> Tensor | None:
        if b is None:
            return None
        if self.name == "z_plus" or (self.set_bias_to_zero and self.name != "epsilon"):
            return torch.zeros_like(b)
        return b


DEFAULT = Rule()


def parse_rule(spec: object, where: str) -> Rule:
    """A rule from ``"gamma"`` or ``{"rule": "gamma", "gamma": 0.5, "set_bias_to_zero": true}``."""
    if isinstance(spec, Rule):
        return spec
    if isinstance(spec, str):
        spec = {"rule": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("rule"), str):
        raise InvalidArgumentError(
            f"rules[{where!r}] must be a rule name ({', '.join(RULE_NAMES)}) or a dict with a "
            f"'rule' key, got {spec!r}",
            argument="rules",
        )
    name = spec["rule"]
    if name not in RULE_NAMES:
        raise InvalidArgumentError(
            f"rules[{where!r}]: unknown rule {name!r}; rules are {', '.join(RULE_NAMES)}",
            argument="rules",
        )
    allowed = {"rule", "epsilon", "gamma", "set_bias_to_zero"}
    extra = set(spec) - allowed
    if extra:
        raise InvalidArgumentError(
            f"rules[{where!r}]: unknown keys {sorted(extra)}; allowed: {sorted(allowed)}",
            argument="rules",
        )
    try:
        rule = Rule(
            name=name,
            epsilon=float(spec.get("epsilon", 1e-9)),
            gamma=float(spec.get("gamma", 0.25)),
            set_bias_to_zero=bool(spec.get("set_bias_to_zero", False)),
        )
    except (TypeError, ValueError):
        raise InvalidArgumentError(
            f"rules[{where!r}]: epsilon and gamma must be numbers", argument="rules"
        ) from None
    if rule.epsilon < 0 or rule.gamma < 0:
        raise InvalidArgumentError(
            f"rules[{where!r}]: epsilon and gamma must be >= 0", argument="rules"
        )
    return rule


def _relevance(site: Site, g: Tensor) -> Tensor:
    """a * vjp(f'(a), g / stab(f'(a))) with the running module's rule (identity: g)."""
    rule: Rule = site.context
    x = site.x
    if rule.name == "identity":
        if g.shape != x.shape:
            raise InvalidArgumentError(
                f"the identity rule needs a layer whose input and output have the same "
                f"shape, got {tuple(x.shape)} -> {tuple(g.shape)}",
                argument="rules",
            )
        return g
    if site.op.weight is not None and rule.name != "epsilon":
        args, kwargs = list(site.args), dict(site.kwargs)
        for (pos, name), modify in zip(site.op.weight, (rule.weight, rule.bias), strict=True):
            if name in kwargs:
                kwargs[name] = modify(kwargs[name])
            elif pos - 1 < len(args):  # positions count the input; site.args do not
                args[pos - 1] = modify(args[pos - 1])
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            zp = site.func(xd, *args, **kwargs)
        z = zp.detach()
        (c,) = torch.autograd.grad(zp, xd, g / (z + _sign(z) * rule.epsilon))
    else:
        c = site.vjp(g / (site.y + _sign(site.y) * rule.epsilon))
    return x * c


def _sign(z: Tensor) -> Tensor:
    return torch.where(z >= 0, torch.ones_like(z), -torch.ones_like(z))


def _pass(site: Site, g: Tensor) -> Tensor:
    return g


@contextmanager
def lrp(model: Any, rules: dict[str, Rule]) -> Iterator[None]:
    """Propagate relevance through every call made inside; module hooks that track which
    module is running are removed in ``finally``."""
    stack: list[str] = []
    handles = []

    def rule_for() -> Rule:
        for name in reversed(stack):
            if name in rules:
                return rules[name]
        return DEFAULT

    try:
        if isinstance(model, nn.Module) and rules:
            for name, mod in model.named_modules():
                if not name:
                    continue

                def pre(m: nn.Module, a: Any, name: str = name) -> None:
                    stack.append(name)

                def post(m: nn.Module, a: Any, out: Any) -> None:
                    if stack:
                        stack.pop()

                handles.append(mod.register_forward_pre_hook(pre))
                handles.append(mod.register_forward_hook(post, always_call=True))
        with intercept.rules(composite(rule_for)):
            yield
    finally:
        for h in handles:
            h.remove()


def composite(rule_for: Callable[[], Rule]) -> Composite:
    """LRP by the ops table's ``lrp`` column: relevance through linear-like calls with the
    running module's rule (``rule_for``, read when the call runs), passed on elsewhere."""
    return Composite(
        "lrp",
        {"relevance": _relevance, "pass": _pass},
        plain_gradient=frozenset({"relevance"}),
        context=rule_for,
    )
