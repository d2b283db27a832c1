"""Layer-wise relevance propagation rules, applied per *call* without touching the weights.

Bach et al. 2015, https://doi.org/10.1371/journal.pone.0130140; Montavon et al. 2019
(the epsilon, gamma and z-plus rules). Relevance is propagated as a modified gradient: every
linear-like call (``F.linear``, convolutions, pooling, batch norm) is replaced, while the
model runs, by an autograd function whose forward value is unchanged and whose backward is

    grad_in = a * vjp(f'(a), grad_out / (f'(a) + eps * sign(f'(a))))

where ``a`` is the call's input and ``f'`` the call with the rule's modified weights (gamma:
W + gamma W+; alpha1_beta0 and z_plus: W+), exactly Captum's two-pass hook construction.
Element-wise activations and dropout pass relevance on unchanged. A tensor addition or
subtraction ``a + b`` (a residual connection) splits its relevance between the terms in
proportion to each, ``R_a = R a / (a + b)`` under epsilon (plain autograd, and Captum, pass
all of it to both terms and double it). Nothing is written to the model: modified weights
are temporaries of the backward pass, so nothing needs restoring.

Which rule applies to a call is decided by the innermost running module that has one in
``rules`` (dotted path -> rule); other calls get Captum's default, epsilon = 1e-9. The key
``"add"``, where the model has no module of that path, sets the rule of every addition.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from methods.engine import hooks, intercept
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
        (c,) = torch.autograd.grad(zp, xd, g / _stabilised(z, rule.epsilon))
    else:
        c = site.vjp(g / _stabilised(site.y, rule.epsilon))
    return x * c


def _stabilised(z: Tensor, eps: float) -> Tensor:
    """z + eps * sign(z), sign(0) = 1 (Captum's); no tensor of ones allocated."""
    return torch.where(z >= 0, z + eps, z - eps)


def _pass(site: Site, g: Tensor) -> Tensor:
    return g


# --- additions: relevance split between the terms (a residual connection's add)

#: callable -> how its two terms enter the result, and its out-of-place form
_SUMS: dict[Any, tuple[str, Any]] = {
    **{f: ("add", torch.add) for f in (torch.add, Tensor.add, Tensor.__add__, Tensor.__radd__,
                                       Tensor.add_, Tensor.__iadd__)},
    **{f: ("sub", torch.sub) for f in (torch.sub, torch.subtract, Tensor.sub, Tensor.subtract,
                                       Tensor.__sub__, Tensor.sub_, Tensor.subtract_,
                                       Tensor.__isub__)},
    **{f: ("rsub", torch.rsub) for f in (torch.rsub, Tensor.__rsub__)},
}  # fmt: skip
_IN_PLACE = frozenset({Tensor.add_, Tensor.__iadd__, Tensor.sub_, Tensor.subtract_,
                       Tensor.__isub__})  # fmt: skip


def _shares(rule: Rule, a: Tensor, b: Tensor, out: Tensor) -> tuple[Tensor, Tensor]:
    """Each term's share of the sum ``out = a + b`` of relevance under ``rule`` (identity
    splits as epsilon: passing all of it to both terms would double it)."""
    if rule.name in ("alpha1_beta0", "z_plus"):
        a, b = a.clamp(min=0), b.clamp(min=0)
        out = a + b
    elif rule.name == "gamma":
        a, b = a + rule.gamma * a.clamp(min=0), b + rule.gamma * b.clamp(min=0)
        out = a + b
    dtype = out.dtype
    if dtype in (torch.float16, torch.bfloat16):  # eps 1e-9 is 0 there: work in float32
        a, b, out = a.float(), b.float(), out.float()
    # z + eps * sign(z) in two passes (sign(-0.0) = -1 here, which no sum's share notices);
    # both terms 0 (two ReLUs off): no relevance to share, and no 0 / 0
    z = out + torch.copysign(torch.tensor(rule.epsilon, dtype=out.dtype, device=out.device), out)
    z = torch.where(z == 0, torch.ones_like(z), z)
    return (a / z).to(dtype), (b / z).to(dtype)


class _Sum(torch.autograd.Function):
    """``out_of_place(a, b, alpha=alpha)`` forward; backward hands each term its share of the
    relevance (summed back over broadcast dims)."""

    @staticmethod
    def forward(
        ctx: Any, a: Tensor, b: Any, out_of_place: Any, alpha: float, kind: str, rule: Rule
    ) -> Tensor:
        out = out_of_place(a, b, alpha=alpha)
        scale_a, scale_b = {"add": (1, alpha), "sub": (1, -alpha), "rsub": (-alpha, 1)}[kind]
        ta = a if scale_a == 1 else a * scale_a
        tb = torch.as_tensor(b, dtype=out.dtype, device=out.device)
        tb = tb if scale_b == 1 else tb * scale_b
        ctx.shares = _shares(rule, ta, tb, out)
        ctx.a_shape = a.shape
        ctx.b_shape = b.shape if isinstance(b, Tensor) else None
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, Tensor | None, *tuple[None, ...]]:
        sa, sb = ctx.shares
        ga = (g * sa).sum_to_size(ctx.a_shape) if ctx.needs_input_grad[0] else None
        gb = None
        if ctx.b_shape is not None and ctx.needs_input_grad[1]:
            gb = (g * sb).sum_to_size(ctx.b_shape)
        return ga, gb, None, None, None, None


class _Sums(TorchFunctionMode):
    """Tensor additions and subtractions with relevance split between their two terms (plain
    autograd passes all of it to both, which doubles it at every residual connection)."""

    def __init__(self, rule_for: Callable[[], Rule]) -> None:
        super().__init__()
        self.rule_for = rule_for

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        entry = _SUMS.get(func)
        if entry is None or not args or "out" in kwargs:
            return func(*args, **kwargs)
        a, b = args[0], args[1] if len(args) > 1 else kwargs.get("other")
        alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
        if not _takes_relevance(a, b) or not _real(alpha):
            return func(*args, **kwargs)
        kind, out_of_place = entry
        y = _Sum.apply(a, b, out_of_place, alpha, kind, self.rule_for())
        return a.copy_(y) if func in _IN_PLACE else y


def _real(v: Any) -> bool:
    return isinstance(v, Tensor) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _takes_relevance(a: Any, b: Any) -> bool:
    """A tensor and a tensor or number, one of them a floating tensor relevance flows to."""
    grads = [isinstance(t, Tensor) and t.is_floating_point() and t.requires_grad for t in (a, b)]
    return isinstance(a, Tensor) and _real(b) and any(grads)


#: the key of ``rules`` naming every tensor addition (when no module has that path)
ADD = "add"


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

    add_rule = rules.get(ADD) if not has_module(model, ADD) else None

    def add_rule_for() -> Rule:
        return add_rule if add_rule is not None else rule_for()

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

                handles.append(hooks.hold(mod.register_forward_pre_hook, pre))
                handles.append(hooks.hold(mod.register_forward_hook, post, always_call=True))
        with intercept.rules(composite(rule_for)), _Sums(add_rule_for):
            yield
    finally:
        for h in handles:
            h.remove()


def has_module(model: Any, path: str) -> bool:
    return isinstance(model, nn.Module) and path in dict(model.named_modules())


def composite(rule_for: Callable[[], Rule]) -> Composite:
    """LRP by the ops table's ``lrp`` column: relevance through linear-like calls with the
    running module's rule (``rule_for``, read when the call runs), passed on elsewhere."""
    return Composite(
        "lrp",
        {"relevance": _relevance, "pass": _pass},
        plain_gradient=frozenset({"relevance"}),
        context=rule_for,
    )
