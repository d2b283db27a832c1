"""Hook-free backward rules for non-linearities, functional or module, reused or not.

Captum's DeepLift, GuidedBackprop and Deconvolution hook ``nn.ReLU``-style *modules*, so a
model that calls ``F.relu``/``torch.sigmoid`` or reuses one module silently gets plain
gradients or crashes. Here each non-linear *call* is intercepted with a ``TorchFunctionMode``
while the model runs and replaced by an autograd function whose forward value is unchanged
and whose backward applies the method's rule to that call's own input and output. Every call
is handled on its own, so functional ops, reused modules and module ops all behave alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

#: rule(x, y, grad_out, plain_grad_in, call) -> grad_in, where call = (func, args, kwargs)
Rule = Callable[[Tensor, Tensor, Tensor, Tensor, tuple[Any, ...]], Tensor]

RELU = (F.relu, torch.relu, Tensor.relu, F.relu_, torch.relu_, Tensor.relu_)
ELEMENTWISE = (
    *RELU,
    F.elu, F.elu_, F.leaky_relu, F.leaky_relu_,
    torch.sigmoid, torch.sigmoid_, Tensor.sigmoid, Tensor.sigmoid_, F.sigmoid,
    torch.tanh, torch.tanh_, Tensor.tanh, Tensor.tanh_, F.tanh,
    F.softplus,
)  # fmt: skip
SOFTMAX = (F.softmax, torch.softmax, Tensor.softmax)
MAXPOOL = {F.max_pool1d: 1, F.max_pool2d: 2, F.max_pool3d: 3}
INPLACE = {F.relu_, torch.relu_, Tensor.relu_, F.elu_, F.leaky_relu_, torch.sigmoid_,
           Tensor.sigmoid_, torch.tanh_, Tensor.tanh_}  # fmt: skip


class _Ruled(torch.autograd.Function):
    """y = fn(x) forward; backward replaced by ``rule`` (given the plain gradient too)."""

    @staticmethod
    def forward(
        ctx: Any, x: Tensor, fn: Callable[[Tensor], Tensor], rule: Rule, call: Any
    ) -> Tensor:
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            y = fn(xd)
        ctx.xd, ctx.y, ctx.rule, ctx.call = xd, y, rule, call
        return y.detach()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        (plain,) = torch.autograd.grad(ctx.y, ctx.xd, grad_out)
        grad_in = ctx.rule(ctx.xd.detach(), ctx.y.detach(), grad_out, plain, ctx.call)
        ctx.xd = ctx.y = None
        return grad_in, None, None, None


class _RuledAnalytic(torch.autograd.Function):
    """As ``_Ruled`` for ops whose derivative is a cheap function of (x, y): no subgraph."""

    @staticmethod
    def forward(
        ctx: Any,
        x: Tensor,
        fn: Callable[[Tensor], Tensor],
        rule: Rule,
        call: Any,
        deriv: Callable[[Tensor, Tensor], Tensor],
    ) -> Tensor:
        y = fn(x)
        ctx.save_for_backward(x, y)
        ctx.rule, ctx.call, ctx.deriv = rule, call, deriv
        return y

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, y = ctx.saved_tensors
        plain = grad_out * ctx.deriv(x, y)
        return ctx.rule(x, y, grad_out, plain, ctx.call), None, None, None, None


def _d_relu(x: Tensor, y: Tensor) -> Tensor:
    return (x > 0).to(x.dtype)


def _d_sigmoid(x: Tensor, y: Tensor) -> Tensor:
    return y * (1 - y)


def _d_tanh(x: Tensor, y: Tensor) -> Tensor:
    return 1 - y * y


def _is_inplace(func: Any, kwargs: dict[str, Any]) -> bool:
    return func in INPLACE or bool(kwargs.get("inplace", False))


class _RuleMode(TorchFunctionMode):
    def __init__(self, rules: dict[Any, Rule]) -> None:
        super().__init__()
        self.rules = rules

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        rule = self.rules.get(func)
        if rule is None or not args or not isinstance(args[0], Tensor):
            return func(*args, **kwargs)
        if func in MAXPOOL and (kwargs.get("return_indices") or (len(args) > 6 and args[6])):
            return func(*args, **kwargs)
        x = args[0]
        if not x.requires_grad:  # nothing to propagate through this call
            return func(*args, **kwargs)
        inplace = _is_inplace(func, kwargs)
        out_kwargs = {k: v for k, v in kwargs.items() if k != "inplace"}
        base = _OUT_OF_PLACE.get(func, func)

        def fn(t: Tensor) -> Tensor:
            return base(t, *args[1:], **out_kwargs)

        # an in-place call overwrites x afterwards, so the rule must keep its own copy
        src = x.clone() if inplace else x
        deriv = _ANALYTIC.get(func)
        if deriv is not None:
            y = _RuledAnalytic.apply(src, fn, rule, (base, args[1:], out_kwargs), deriv)
        else:
            y = _Ruled.apply(src, fn, rule, (base, args[1:], out_kwargs))
        if inplace:
            return x.copy_(y)
        return y


_OUT_OF_PLACE: dict[Any, Any] = {
    F.relu_: F.relu, torch.relu_: torch.relu, Tensor.relu_: torch.relu,
    F.elu_: F.elu, F.leaky_relu_: F.leaky_relu, torch.sigmoid_: torch.sigmoid,
    Tensor.sigmoid_: torch.sigmoid, torch.tanh_: torch.tanh, Tensor.tanh_: torch.tanh,
}  # fmt: skip


_ANALYTIC: dict[Any, Callable[[Tensor, Tensor], Tensor]] = {
    **dict.fromkeys(RELU, _d_relu),
    **dict.fromkeys((torch.sigmoid, torch.sigmoid_, Tensor.sigmoid, Tensor.sigmoid_, F.sigmoid),
                    _d_sigmoid),
    **dict.fromkeys((torch.tanh, torch.tanh_, Tensor.tanh, Tensor.tanh_, F.tanh), _d_tanh),
}  # fmt: skip


@contextmanager
def rules(mapping: dict[Any, Rule]) -> Iterator[None]:
    """Apply ``mapping`` (torch function -> backward rule) to every call made inside."""
    with _RuleMode(mapping):
        yield


# --- DeepLift's rescale and max rules (Shrikumar et al. 2017, https://arxiv.org/abs/1704.02685)


def _halves_ok(x: Tensor) -> bool:
    return x.dim() >= 1 and x.shape[0] % 2 == 0


def _diffs(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    xi, xr = x.chunk(2)
    yi, yr = y.chunk(2)
    dx, dy = xi - xr, yi - yr
    return torch.cat([dx, dx]), torch.cat([dy, dy])


def rescale_rule(eps: float) -> Rule:
    def rule(x: Tensor, y: Tensor, g: Tensor, plain: Tensor, call: Any) -> Tensor:
        if not _halves_ok(x):
            return plain
        dx, dy = _diffs(x, y)
        return torch.where(dx.abs() < eps, plain, g * dy / dx)

    return rule


def softmax_rule(eps: float) -> Rule:
    """DeepLift's Rescale rule through softmax written as ``exp(x - logsumexp(x))``.

    Per example (reductions along the softmax dim only), with e = exp(x - M), S = sum(e),
    z = x - log S: d(log S) = sum_k (de_k / dx_k) dx_k / L(S, S') (L the logarithmic mean)
    and dy_j = (dy_j / dz_j) dz_j, so the multipliers m_k = g_k r_k - (g . r) w_k give
    sum(m * dx) = sum(g * dy) exactly; they reduce to the gradient as x' -> x and for a
    shift x = x' + c. Captum 0.9.0 instead centres rescale multipliers over the whole doubled
    batch, which breaks completeness and couples the examples (see README).
    """

    def rule(x: Tensor, y: Tensor, g: Tensor, plain: Tensor, call: Any) -> Tensor:
        dim = _softmax_dim(x, call)
        if not _halves_ok(x) or dim is None:
            return plain  # a softmax over the batch mixes inputs and baselines itself
        xi, xr = x.to(y.dtype).chunk(2)
        yi, yr = y.chunk(2)
        top = torch.maximum(xi.amax(dim, keepdim=True), xr.amax(dim, keepdim=True))
        ei, er = (xi - top).exp(), (xr - top).exp()
        si, sr = ei.sum(dim, keepdim=True), er.sum(dim, keepdim=True)
        dlse = si.log() - sr.log()
        dx = xi - xr
        rho = torch.where(_tiny(dx, eps), (ei + er) / 2, (ei - er) / dx)
        lmean = torch.where(_tiny(dlse, eps), (si + sr) / 2, (si - sr) / dlse)
        dz = dx - dlse
        r = torch.where(_tiny(dz, eps), (yi + yr) / 2, (yi - yr) / dz)
        w = rho / lmean
        r2, w2 = torch.cat([r, r]), torch.cat([w, w])
        gr = g * r2
        return (gr - gr.sum(dim, keepdim=True) * w2).to(x.dtype)

    return rule


def _tiny(d: Tensor, eps: float) -> Tensor:
    return (d.abs() < eps) | ~torch.isfinite(d)  # equal inputs, or -inf on both sides (masks)


def _softmax_dim(x: Tensor, call: Any) -> int | None:
    """The softmax's dim, normalised; None where it is the batch dim (or cannot be found)."""
    _func, rest, kwargs = call
    dim = kwargs.get("dim", rest[0] if rest else None)
    if dim is None:  # torch's legacy implicit choice (F._get_softmax_dim)
        dim = 0 if x.dim() in (0, 1, 3) else 1
    if not isinstance(dim, int) or x.dim() == 0:
        return None
    dim %= x.dim()
    return None if dim == 0 else dim


def maxpool_rule(eps: float) -> Rule:
    """DeepLift's max rule: each window's output change goes to its argmax in both halves.

    Where windows overlap (stride < kernel size, e.g. MaxPool2d(3, 2, 1)) one input can be the
    argmax of several windows; their changes are *added* (Captum's ``max_unpool`` keeps one,
    which breaks completeness). With non-overlapping windows this equals Captum exactly.
    """

    def rule(x: Tensor, y: Tensor, g: Tensor, plain: Tensor, call: Any) -> Tensor:
        if not _halves_ok(x):
            return plain
        func, rest, kwargs = call
        dims = MAXPOOL[func]
        params = _pool_params(rest, kwargs)
        xi, xr = x.chunk(2)
        yi, yr = y.chunk(2)
        dx = torch.cat([xi - xr, xi - xr])
        ymax = torch.max(yi, yr)
        dy = torch.cat([ymax - yr, yi - ymax])
        _, indices = func(x, *params[:5], return_indices=True)
        a, b = _scatter_unpool(g * dy, indices, x.shape, dims).chunk(2)
        summed = a + b
        return torch.where(dx.abs() < eps, plain, torch.cat([summed, summed]) / dx)

    return rule


def _scatter_unpool(src: Tensor, indices: Tensor, shape: torch.Size, dims: int) -> Tensor:
    """``max_unpool`` that adds: ``src`` summed at the flat spatial ``indices``."""
    lead = tuple(shape[: len(shape) - dims])
    out = src.new_zeros(*lead, math.prod(shape[len(lead) :]))
    out.scatter_add_(len(lead), indices.reshape(*lead, -1), src.reshape(*lead, -1))
    return out.reshape(shape)


def _pool_params(rest: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    names = ["kernel_size", "stride", "padding", "dilation", "ceil_mode"]
    defaults: list[Any] = [None, None, 0, 1, False]
    values = list(rest[:5]) + defaults[len(rest[:5]) :]
    for i, name in enumerate(names):
        if name in kwargs:
            values[i] = kwargs[name]
    return values


def deeplift_rules(eps: float) -> dict[Any, Rule]:
    mapping: dict[Any, Rule] = {}
    for elementwise in ELEMENTWISE:
        mapping[elementwise] = rescale_rule(eps)
    for softmax in SOFTMAX:
        mapping[softmax] = softmax_rule(eps)
    for pool in MAXPOOL:
        mapping[pool] = maxpool_rule(eps)
    return mapping


# --- Guided backprop (Springenberg et al. 2015) and deconvolution (Zeiler & Fergus 2014)


def _guided(x: Tensor, y: Tensor, g: Tensor, plain: Tensor, call: Any) -> Tensor:
    return F.relu(plain)


def _deconv(x: Tensor, y: Tensor, g: Tensor, plain: Tensor, call: Any) -> Tensor:
    return F.relu(g)


GUIDED_BACKPROP: dict[Any, Rule] = dict.fromkeys(RELU, _guided)
DECONVOLUTION: dict[Any, Rule] = dict.fromkeys(RELU, _deconv)


def ruled(forward: Any, mapping: dict[Any, Rule]) -> Any:
    """``forward`` with ``mapping`` applied while the model runs (not during backward)."""
    fn = forward.fn

    def wrapped(*args: Any) -> Any:
        with _RuleMode(mapping):
            return fn(*args)

    return type(forward)(wrapped, forward.args)
