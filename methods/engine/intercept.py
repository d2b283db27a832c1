"""Hook-free backward rules for the operations of ``ops``, functional or module, reused or not.

Captum's DeepLift, GuidedBackprop, Deconvolution and LRP hook ``nn.ReLU``-style *modules*,
so a model that calls ``F.relu``/``torch.sigmoid`` or reuses one module silently gets plain
gradients or crashes. Here each *call* of an op in the table is intercepted with one
``TorchFunctionMode`` while the model runs and replaced by an autograd function whose
forward value is unchanged and whose backward applies the method's rule to that call's own
input and output. Every call is handled on its own, so functional ops, reused modules and
module ops all behave alike.

A method names its rules with a ``Composite`` (after Zennit's composites): a small map from
a column of the ops table (``name``, ``kind``, ``deeplift``, ``lrp``) to a rule. A rule is
``rule(site, grad_out) -> grad_in``; the ``Site`` holds the call (its op, arguments, input
and output) and its plain vector-Jacobian product.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from methods.engine import ops
from methods.engine.ops import Op


@dataclass(eq=False)
class Site:
    """One intercepted call, as its rule sees it in the backward pass."""

    op: Op
    #: the out-of-place callable, and the call's arguments after the input
    func: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: what the composite's ``context()`` returned when the call ran (LRP: the module's rule)
    context: Any = None
    x: Tensor = field(init=False)
    y: Tensor = field(init=False)
    _vjp: Callable[[Tensor], Tensor] | None = field(init=False, default=None)

    def call(self, t: Tensor, **overrides: Any) -> Tensor:
        """The call on another input, with keyword arguments replaced by ``overrides``."""
        return self.func(t, *self.args, **{**self.kwargs, **overrides})

    def own(self) -> None:
        """Copy the input and output the rule reads: the model is about to write in place
        into a tensor they share storage with (``nn.ReLU(inplace=True)`` after a layer)."""
        self.x, self.y = self.x.clone(), self.y.clone()

    def vjp(self, v: Tensor) -> Tensor:
        """The plain vector-Jacobian product ``v @ dy/dx`` of the call at its input (once)."""
        if self._vjp is None:
            raise RuntimeError("this rule did not ask for the plain gradient")
        return self._vjp(v)


#: rule(site, grad_out) -> grad_in
Rule = Callable[[Site, Tensor], Tensor]


@dataclass(frozen=True)
class Composite:
    """The rules of one method: ``rules[getattr(op, column)]`` for each op of the table.

    ``plain_gradient``: whether the rules call ``site.vjp`` (then the call's subgraph, or its
    analytic derivative, is kept for the backward): True, False, or the keys whose rules do.
    ``context``, if given, is called when an op runs and its value handed to the rule (LRP
    reads the running module's rule this way).
    """

    column: str
    rules: Mapping[Any, Rule]
    plain_gradient: bool | frozenset[Any] = True
    context: Callable[[], Any] | None = None

    def rule(self, op: Op) -> tuple[Rule | None, bool]:
        """The op's rule, and whether it needs the plain gradient."""
        key = getattr(op, self.column)
        plain = self.plain_gradient
        return self.rules.get(key), plain if isinstance(plain, bool) else key in plain


class _Intercepted(torch.autograd.Function):
    """y = site.call(x) forward; backward replaced by ``rule(site, grad_out)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, site: Site, rule: Rule, plain: bool) -> Tensor:
        deriv = site.op.derivative
        if plain and deriv is None:
            with torch.enable_grad():
                xd = x.detach().requires_grad_(True)
                y = site.call(xd)

            def vjp(v: Tensor) -> Tensor:
                return torch.autograd.grad(y, xd, v)[0]

            site.x, site.y, site._vjp = xd.detach(), y.detach(), vjp
            out = site.y
        else:
            out = site.call(x)
            site.x, site.y = x.detach(), out.detach()
            if plain and deriv is not None:
                d = deriv(site.x, site.y)
                site._vjp = lambda v: v * d
        ctx.site, ctx.rule = site, rule
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, None, None, None]:
        site, rule = ctx.site, ctx.rule
        ctx.site = ctx.rule = None  # the call's subgraph goes with the site
        return rule(site, grad_out), None, None, None


class _Mode(TorchFunctionMode):
    def __init__(self, composite: Composite) -> None:
        super().__init__()
        self.composite = composite
        #: id of a tensor's storage owner -> the sites whose saved x or y share its storage
        self.sharing: dict[int, list[Site]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.sharing:
            for t in _written(func, args, kwargs):
                for site in self.sharing.pop(id(_root(t)), ()):
                    site.own()
        op = ops.BY_FUNCTION.get(func)
        rule, plain = (None, False) if op is None else self.composite.rule(op)
        if rule is None or op is None or not args or not isinstance(args[0], Tensor):
            return func(*args, **kwargs)
        x = args[0]
        if not x.requires_grad or _returns_indices(op, args, kwargs):
            return func(*args, **kwargs)  # nothing to propagate, or not one output tensor
        inplace = ops.is_inplace(func, kwargs)
        kw = {k: v for k, v in kwargs.items() if k != "inplace"}
        c = self.composite
        site = Site(op, ops.OUT_OF_PLACE.get(func, func), tuple(args[1:]), kw,
                    None if c.context is None else c.context())  # fmt: skip
        # an in-place call overwrites x afterwards, so the rule must keep its own copy
        y = _Intercepted.apply(x.clone() if inplace else x, site, rule, plain)
        if inplace:
            return x.copy_(y)
        for t in (x, y):  # site.x and site.y share these tensors' storage
            self.sharing.setdefault(id(_root(t)), []).append(site)
        return y


def _root(t: Tensor) -> Tensor:
    return t if t._base is None else t._base


def _written(func: Any, args: Any, kwargs: dict[str, Any]) -> list[Tensor]:
    """The tensors a call writes into: its first argument when in place, and ``out=``."""
    out = ops.as_tensors(kwargs.get("out"))
    name = getattr(func, "__name__", "")
    inplace = (name.endswith("_") and not name.endswith("__")) or name == "__setitem__"
    if args and isinstance(args[0], Tensor) and (inplace or kwargs.get("inplace") is True):
        out.append(args[0])
    return out


def _returns_indices(op: Op, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if "return_indices" not in op.signature:
        return False
    pos = 1 + op.signature.index("return_indices")
    return bool(kwargs.get("return_indices") or (len(args) > pos and args[pos]))


@contextmanager
def rules(composite: Composite) -> Iterator[None]:
    """Apply ``composite`` to every call made inside."""
    with _Mode(composite):
        yield


def ruled(forward: Any, composite: Composite) -> Any:
    """``forward`` with ``composite`` applied while the model runs (not during backward)."""
    fn = forward.fn

    def wrapped(*args: Any) -> Any:
        with _Mode(composite):
            return fn(*args)

    return dataclasses.replace(forward, fn=wrapped)


# --- Guided backprop (Springenberg et al. 2015) and deconvolution (Zeiler & Fergus 2014)


def _guided(site: Site, g: Tensor) -> Tensor:
    return F.relu(site.vjp(g))


def _deconv(site: Site, g: Tensor) -> Tensor:
    return F.relu(g)


GUIDED_BACKPROP = Composite("name", {"relu": _guided})
DECONVOLUTION = Composite("name", {"relu": _deconv}, plain_gradient=False)
