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
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from methods.engine import intercept
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


# (weight position, bias position) in the call's positional arguments, and kwarg names
WEIGHTED: dict[Any, tuple[int, int, str, str]] = {
    F.linear: (1, 2, "weight", "bias"),
    F.conv1d: (1, 2, "weight", "bias"),
    F.conv2d: (1, 2, "weight", "bias"),
    F.conv3d: (1, 2, "weight", "bias"),
    torch.conv1d: (1, 2, "weight", "bias"),
    torch.conv2d: (1, 2, "weight", "bias"),
    torch.conv3d: (1, 2, "weight", "bias"),
    F.batch_norm: (3, 4, "weight", "bias"),
}
POOLING = (
    F.max_pool1d, F.max_pool2d, F.max_pool3d,
    F.avg_pool1d, F.avg_pool2d, F.avg_pool3d,
    F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d,
)  # fmt: skip
PASS_THROUGH = (*intercept.ELEMENTWISE, F.dropout, F.dropout1d, F.dropout2d, F.dropout3d)


def _with(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str, value: Any) -> None:
    """Set argument ``pos``/``name`` in place in (list) args or kwargs."""
    if name in kwargs:
        kwargs[name] = value
    elif pos < len(args):
        args[pos] = value  # type: ignore[index]


def _get(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[pos] if pos < len(args) else None


class _Relevance(torch.autograd.Function):
    """y = f(a) forward; backward a * vjp(f'(a), g / stab(f'(a))), or g for identity."""

    @staticmethod
    def forward(
        ctx: Any,
        a: Tensor,
        f: Callable[[Tensor], Tensor],
        fp: Callable[[Tensor], Tensor] | None,
        rule: Rule,
    ) -> Tensor:
        with torch.enable_grad():
            ad = a.detach().requires_grad_(True)
            zp = (fp or f)(ad)
        y = zp.detach() if fp is None else f(a.detach())
        ctx.ad, ctx.zp, ctx.rule = ad, zp, rule
        return y

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor | None, None, None, None]:
        ad, zp, rule = ctx.ad, ctx.zp, ctx.rule
        ctx.ad = ctx.zp = None
        if rule.name == "identity":
            if g.shape != ad.shape:
                raise InvalidArgumentError(
                    f"the identity rule needs a layer whose input and output have the same "
                    f"shape, got {tuple(ad.shape)} -> {tuple(g.shape)}",
                    argument="rules",
                )
            return g, None, None, None
        z = zp.detach()
        sign = torch.where(z >= 0, torch.ones_like(z), -torch.ones_like(z))
        (c,) = torch.autograd.grad(zp, ad, g / (z + sign * rule.epsilon))
        return ad.detach() * c, None, None, None


class _PassThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: Tensor, f: Callable[[Tensor], Tensor]) -> Tensor:
        return f(a.detach())

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None]:
        return g, None


class _LRPMode(TorchFunctionMode):
    def __init__(self, rule_for: Callable[[], Rule]) -> None:
        super().__init__()
        self.rule_for = rule_for

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if not args or not isinstance(args[0], Tensor) or not args[0].requires_grad:
            return func(*args, **kwargs)
        if func in PASS_THROUGH:
            inplace = intercept._is_inplace(func, kwargs)
            base = intercept._OUT_OF_PLACE.get(func, func)
            kw = {k: v for k, v in kwargs.items() if k != "inplace"}
            y = _PassThrough.apply(args[0], lambda t: base(t, *args[1:], **kw))
            return args[0].copy_(y) if inplace else y
        if func in POOLING:
            if kwargs.get("return_indices"):
                return func(*args, **kwargs)
            rule = self.rule_for()

            def pooled(t: Tensor) -> Tensor:
                return func(t, *args[1:], **kwargs)

            return _Relevance.apply(args[0], pooled, None, rule)
        spec = WEIGHTED.get(func)
        if spec is None:
            return func(*args, **kwargs)
        rule = self.rule_for()
        wpos, bpos, wname, bname = spec
        rest = list(args)

        def call(t: Tensor, a: list[Any], kw: dict[str, Any]) -> Tensor:
            return func(t, *a[1:], **kw)

        if rule.name in ("epsilon", "identity"):
            fp = None
        else:
            a2, kw2 = list(rest), dict(kwargs)
            _with(a2, kw2, wpos, wname, rule.weight(_get(args, kwargs, wpos, wname)))  # type: ignore[arg-type]
            _with(a2, kw2, bpos, bname, rule.bias(_get(args, kwargs, bpos, bname)))  # type: ignore[arg-type]

            def fp(t: Tensor) -> Tensor:
                return call(t, a2, kw2)

        return _Relevance.apply(args[0], lambda t: call(t, rest, kwargs), fp, rule)


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
        with _LRPMode(rule_for):
            yield
    finally:
        for h in handles:
            h.remove()
