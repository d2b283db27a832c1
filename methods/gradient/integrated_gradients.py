"""Integrated Gradients: the path integral of gradients from the baseline to the input.

Sundararajan et al. 2017, https://arxiv.org/abs/1703.01365. With ``n_steps="auto"`` the
fewest steps on a fixed ladder whose convergence delta is within ``delta_tolerance`` are used,
reusing every gradient already computed where the rule's points nest.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, Field

from methods.cost import CostShape
from methods.engine.baselines import format_baselines
from methods.engine.batching import memory_budget
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.engine.path import (
    GradFn,
    completeness_delta,
    endpoint_outputs,
    output_change,
    path_gradient_sum,
    plain_gradients,
)
from methods.engine.precision import model_dtype
from methods.engine.quadrature import rule_tensors
from methods.errors import InvalidArgumentError
from methods.params import MultiplyByInputsParams, PositiveInt, QuadratureParams
from methods.registry import TokenCounterpart, register


class AutoStepsParams(BaseModel):
    """``n_steps`` that may be ``"auto"``, and the tolerance it stops on (integrated gradients
    and layer integrated gradients)."""

    n_steps: PositiveInt | Literal["auto"] = Field(
        50, description="integration points, or 'auto' for the fewest meeting delta_tolerance"
    )
    delta_tolerance: float = Field(
        0.01,
        gt=0,
        description="n_steps='auto' only: largest accepted |convergence delta|, as a fraction "
        "of |f(inputs) - f(baselines)| per example",
    )


class IntegratedGradientsParams(AutoStepsParams, QuadratureParams, MultiplyByInputsParams):
    pass


#: Ladders for n_steps="auto". Riemann grids nest when refined (left/right/trapezoid by
#: halving the spacing, middle by thirds), so each rung evaluates only the new points.
LADDERS: dict[str, tuple[int, ...]] = {
    "gausslegendre": (4, 8, 16, 32, 64, 128, 256, 512),
    "riemann_trapezoid": (5, 9, 17, 33, 65, 129, 257, 513),
    # first-order rules converge slowly: a longer ladder, cheap since each rung reuses the last
    "riemann_left": (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
    "riemann_right": (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
    "riemann_middle": (3, 9, 27, 81, 243, 729),
    # Chebyshev points: N intervals' are among 2N's, so every rung reuses the last's gradients
    "clenshaw_curtis": (2, 3, 5, 9, 17, 33, 65, 129, 257, 513),
}
#: the rule of n_steps="auto" when none is named: nested, so stopping at n points costs n
#: evaluations (Gauss-Legendre's rungs share no point: stopping at 32 costs 4+8+16+32 = 60)
#: and as accurate per point on smooth paths
AUTO_RULE = "clenshaw_curtis"
#: Clenshaw-Curtis's first pass evaluates the first rung of at least this many points, by
#: device type: where a pass costs its kernel launches, not its rows, rungs that may not be
#: needed cost nothing and the passes they spare do (BERT-base layer IG on an H200 stopped
#: at 5 points after four passes, 0.095 s, slower than 50 fixed points in one, 0.071 s); the
#: lower rungs are read off the same points, so the answer is the one rung by rung would give
LOOKAHEAD_POINTS = {"cuda": 17}


def auto_rule(p: IntegratedGradientsParams) -> str:
    """The rule n_steps="auto" climbs: the one named, else ``AUTO_RULE``."""
    return p.approximation_method if "approximation_method" in p.model_fields_set else AUTO_RULE


def ladder_top(approximation_method: str) -> int:
    """The most steps n_steps="auto" takes with this rule: its ladder's last rung."""
    return LADDERS[approximation_method][-1]


def auto_cost(p: Any, shape: CostShape) -> int:
    """Rows per example: the ladder's top for n_steps="auto" (what it may take), plus the
    endpoints' forward."""
    steps = ladder_top(auto_rule(p)) if p.n_steps == "auto" else p.n_steps
    return steps + (2 if shape.return_delta else 0)


def _check_steps(p: IntegratedGradientsParams) -> None:
    if p.n_steps != "auto" and p.n_steps < 1:
        raise InvalidArgumentError(f"n_steps must be >= 1, got {p.n_steps}", argument="n_steps")


@register(
    "integrated_gradients",
    generation="gradient",
    exportable=True,
    family="gradient",
    params=IntegratedGradientsParams,
    returns_delta=True,
    batching="internal_batch_size",
    cost=auto_cost,
    # "auto" stops once every example in the call has converged
    couples_examples=lambda p: p.n_steps == "auto",
    auto_steps=lambda p: ladder_top(auto_rule(p)),
    token_counterpart=TokenCounterpart("layer_integrated_gradients"),
)
def integrated_gradients(call: Call, p: IntegratedGradientsParams) -> Output:
    """Integrated gradients from the baselines (default zeros) to the inputs."""
    _check_steps(p)
    xs = call.inputs
    bs = format_baselines(call.baselines, xs)
    if p.n_steps == "auto":
        return _auto(call, p, xs, bs)
    alphas, weights = rule_tensors(p.approximation_method, p.n_steps, xs[0].dtype, xs[0].device)
    grads, echo = path_gradient_sum(call, xs, bs, alphas, weights)
    attrs = _finish(grads, xs, bs, p.multiply_by_inputs)
    out = Output(attrs, echo=echo)
    if call.return_delta:
        fx, fb = endpoint_outputs(call, xs, bs)
        out.delta, out.outputs = completeness_delta(attrs, fx, fb), fx
    return out


def _finish(grads: Tensors, xs: Tensors, bs: Tensors, mbi: bool) -> Tensors:
    if not mbi:
        return grads
    return tuple((x - b) * g for x, b, g in zip(xs, bs, grads, strict=True))


def _new_points(method: str, n: int, prev: int | None) -> tuple[list[float], list[float], float]:
    """Points added at rung ``n`` after rung ``prev``, their unit weights, and the step h."""
    if method == "riemann_trapezoid":
        h = 1.0 / (n - 1)
        idx: list[int] = list(range(n)) if prev is None else list(range(1, n, 2))
        units = [0.5 if prev is None and i in (0, n - 1) else 1.0 for i in idx]
        return [i * h for i in idx], units, h
    if method in ("riemann_left", "riemann_right"):
        if prev is None:
            first = 1 if method == "riemann_right" else 0
            idx = list(range(first, n + first))
        else:  # halving the spacing adds the odd multiples of 1/n
            idx = list(range(1, n, 2))
        return [i / n for i in idx], [1.0] * len(idx), 1.0 / n
    if method == "riemann_middle":
        idx = list(range(n)) if prev is None else [i for i in range(n) if i % 3 != 1]
        return [(i + 0.5) / n for i in idx], [1.0] * len(idx), 1.0 / n
    raise InvalidArgumentError(f"no nested ladder for {method}", argument="approximation_method")


def _auto(call: Call, p: IntegratedGradientsParams, xs: Tensors, bs: Tensors) -> Output:
    check_auto(p)
    fx, fb = endpoint_outputs(call, xs, bs)
    attrs, delta, echo = auto_integral(call, p, xs, bs, fx, fb)
    return Output(attrs, delta=delta, outputs=fx, echo=echo)


def check_auto(p: Any) -> None:
    if not p.multiply_by_inputs:
        raise InvalidArgumentError(
            "n_steps='auto' stops on the convergence delta, which needs multiply_by_inputs=True",
            argument="n_steps",
        )


def auto_integral(
    call: Call,
    p: Any,
    xs: Tensors,
    bs: Tensors,
    fx: torch.Tensor,
    fb: torch.Tensor,
    grad_fn: GradFn = plain_gradients,
) -> tuple[Tensors, torch.Tensor, dict[str, Any]]:
    """Integrated gradients from ``bs`` to ``xs`` (the inputs, or a layer's values with its
    ``grad_fn``) on the ladder of ``auto_rule(p)``, stopping at the first rung whose
    convergence delta against f(x) - f(b) (``fx``, ``fb``) is within ``p.delta_tolerance``
    for every example: the attributions, the delta and what was used."""
    dtype, device = xs[0].dtype, xs[0].device
    gap = output_change(fx, fb).abs().to(dtype)
    # Where f(x) ~ f(b) a purely relative tolerance would be ~0 and unreachable; below
    # sqrt(eps) of the outputs' scale the delta is rounding, not quadrature error.
    scale = torch.maximum(fx.abs(), fb.abs()).to(dtype).clamp(min=1.0)
    tol = p.delta_tolerance * torch.maximum(gap, scale * torch.finfo(dtype).eps ** 0.5)
    low = _low_eps(call.model, dtype)
    method = auto_rule(p)
    ladder = LADDERS[method]
    acc: Tensors | None = None
    prev: int | None = None
    attrs: Tensors = ()
    change: float | None = None
    met = False
    delta = torch.zeros_like(fx)
    evaluated = 0
    echo: dict[str, Any] = {}
    nested = _Kept(call, xs, bs, grad_fn)  # Clenshaw-Curtis: every point's gradient so far
    point_bytes = sum(x.numel() * x.element_size() for x in xs)  # one point's gradients
    # the rung the first pass reaches for, where a pass costs its launches
    look = next((m for m in ladder if m >= LOOKAHEAD_POINTS.get(device.type, 0)), ladder[-1])
    for n in ladder:
        if method == "clenshaw_curtis" and n * point_bytes > memory_budget(device):
            # keeping every point's gradient would pass the memory budget: the rung whole,
            # as Gauss-Legendre's ladder goes (nothing kept)
            alphas, weights = rule_tensors(method, n, dtype, device)
            grads, echo = path_gradient_sum(call, xs, bs, alphas, weights, grad_fn=grad_fn)
            nested = _Kept(call, xs, bs, grad_fn)
            h = 1.0
            evaluated += n
        elif method == "clenshaw_curtis":
            if nested.level < n:
                ahead = not nested.level and look * point_bytes <= memory_budget(device)
                echo = nested.extend(max(n, look) if ahead else n, dtype, device)
                evaluated = nested.evaluated
            grads = nested.rung(n, dtype, device)
            h = 1.0
        elif method == "gausslegendre":
            alphas, weights = rule_tensors(method, n, dtype, device)
            grads, echo = path_gradient_sum(call, xs, bs, alphas, weights, grad_fn=grad_fn)
            h = 1.0
            evaluated += n
        else:
            pts, units, h = _new_points(method, n, prev)
            alphas = torch.tensor(pts, dtype=dtype, device=device)
            weights = torch.tensor(units, dtype=dtype, device=device)
            part, echo = path_gradient_sum(call, xs, bs, alphas, weights, grad_fn=grad_fn)
            grads = part if acc is None else tuple(a + q for a, q in zip(acc, part, strict=True))
            acc = grads
            evaluated += len(pts)
        last, attrs = attrs, _finish(tuple(g * h for g in grads), xs, bs, True)
        delta = completeness_delta(attrs, fx, fb)
        prev = n
        change = _change(attrs, last) if last else None
        met = bool((delta.abs() <= tol + _rounding(low, attrs, fx, fb)).all())
        # Stop when the delta is met and the last rung moved the attributions by less than the
        # tolerance (on a ReLU net the delta can be met while single attributions are still
        # 5% off: measured on ResNet-50), or when the rungs agree ten times closer than that
        # though the delta is not met: the rest of the delta is not quadrature error (rounding
        # of a small output gap; measured on ViT-B, where 513 steps did not meet 1e-3). A model
        # computing in bfloat16 or float16 resolves no finer than its epsilon: rungs that agree
        # to it have converged (bfloat16 BERT-base on an H200 climbed to 257 steps otherwise)
        if change is not None and change <= p.delta_tolerance and met:
            stopped = "delta"
            break
        if change is not None and change <= max(0.1 * p.delta_tolerance, low):
            stopped = "stable"
            break
    else:
        stopped = "ladder_top"
    echo.update(
        n_steps=prev,
        n_steps_evaluated=evaluated,
        converged=met,
        stopped=stopped,
        change=change,
        approximation_method=method,
    )
    return attrs, delta, echo


class _Kept:
    """Clenshaw-Curtis's nested points: the gradient at each evaluated point, and its index j
    at rung ``level`` (point j of N intervals is point 2j of 2N), from which any rung up to
    ``level`` is a weighted sum without evaluating again."""

    def __init__(self, call: Call, xs: Tensors, bs: Tensors, grad_fn: GradFn) -> None:
        self.call, self.xs, self.bs, self.grad_fn = call, xs, bs, grad_fn
        self.kept: Tensors = ()
        self.index: list[int] = []
        self.level = 0
        self.evaluated = 0

    def extend(self, upto: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        """Evaluate the points of rung ``upto`` not evaluated yet."""
        alphas, _ = rule_tensors("clenshaw_curtis", upto, dtype, device)
        if self.level:
            step = (upto - 1) // (self.level - 1)
            self.index = [j * step for j in self.index]
            new = [j for j in range(upto) if j % step]
        else:
            new = list(range(upto))
        part, echo = path_gradient_sum(
            self.call, self.xs, self.bs, alphas[new], None, grad_fn=self.grad_fn
        )
        kept = self.kept or tuple(q[:0] for q in part)
        self.kept = tuple(torch.cat([k, q]) for k, q in zip(kept, part, strict=True))
        self.index += new
        self.level, self.evaluated = upto, self.evaluated + len(new)
        return echo

    def rung(self, n: int, dtype: torch.dtype, device: torch.device) -> Tensors:
        """The weighted gradient sum of rung ``n`` (at most ``level``)."""
        _, weights = rule_tensors("clenshaw_curtis", n, dtype, device)
        step = (self.level - 1) // (n - 1)
        pick = [k for k, j in enumerate(self.index) if j % step == 0]
        w = weights[[self.index[k] // step for k in pick]]
        rows = torch.tensor(pick, device=device)
        return tuple(torch.tensordot(w.to(k.dtype), k[rows], dims=1) for k in self.kept)


def _low_eps(model: Any, dtype: torch.dtype) -> float:
    """The epsilon of the precision the model computes in where it is coarser than float32's
    (a bfloat16 or float16 model, or inputs); 0 otherwise."""
    eps = max(torch.finfo(dtype).eps, torch.finfo(model_dtype(model)).eps)
    return eps if eps > torch.finfo(torch.float32).eps else 0.0


def _rounding(low: float, attrs: Tensors, fx: torch.Tensor, fb: torch.Tensor) -> torch.Tensor:
    """How far rounding alone can move the convergence delta of a low-precision model: twice
    its epsilon over everything the delta sums (f(x), f(b) and every attribution)."""
    if not low:
        return torch.zeros((), device=fx.device)
    n = fx.shape[0]
    mass = (fx.abs().float() + fb.abs().float()).reshape(n, -1).sum(1)  # a bound: float32
    mass = mass + sum(a.reshape(n, -1).abs().float().sum(1) for a in attrs)
    return 2 * low * mass


def _change(attrs: Tensors, last: Tensors) -> float:
    """||attrs - last|| / ||attrs|| over every input: how much the last rung moved them."""
    num = sum(
        float((a.double() - b.double()).pow(2).sum()) for a, b in zip(attrs, last, strict=True)
    )
    den = sum(float(a.double().pow(2).sum()) for a in attrs)
    return (num / den) ** 0.5 if den > 0 else (0.0 if num == 0 else float("inf"))
