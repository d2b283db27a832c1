"""Adversarial attacks with Captum's semantics: FGSM (Goodfellow et al., 2015) and PGD (Madry
et al., 2018), ``methods.attack``.

The loss is Captum's default per example, ``-log(output[target])`` (``loss="nll"``, for models
that return probabilities), or the same after a log-softmax over dim 1 (``"cross_entropy"``,
for logits), or ``"margin"``: the largest other output minus the target's (the other classes
along dim 1 at the target's position), which does not saturate where a softmax does; the
batch's losses are summed, never averaged, so an example's attack never depends on its batch.
A gradient element at most 1e-6 in size leaves its input element as it is (Captum's zero
threshold); an example whose every gradient element was that small at every step did not move,
and says so (``zero_gradient``): a confident logit model's softmax rounds to exactly one, its
cross-entropy gradient vanishes, and "not flipped" would otherwise read as robust.

PGD takes FGSM sign steps for both norms and projects back onto the ball around the inputs:
clamped for ``Linf``, ``torch.renorm`` per example for ``L2``. With ``random_start`` PGD starts
at a uniform point of that ball, drawn from a generator seeded with ``seed`` (Captum draws from
the global RNG). ``targeted`` attacks descend the loss of
``target`` instead of ascending it: untargeted, the margin grows until another class passes the
target; targeted, it shrinks until the target passes the others (the target's output minus the
largest other, the reverse, grows).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine import layout
from methods.engine.guard import model_guard
from methods.engine.inputs import Forward, Tensors, format_args, format_inputs, restore_form
from methods.engine.targets import Target, make_target
from methods.errors import InvalidArgumentError, InvalidTypeError, UnknownParameterError

#: gradient elements at most this large leave their input element unchanged (Captum's)
ZERO_THRESHOLD = 1e-6
LOSSES = ("nll", "cross_entropy", "margin")
#: a parameter without a default
REQUIRED: Any = object()
#: each method's parameters and defaults
PARAMS: dict[str, dict[str, Any]] = {
    "fgsm": {
        "epsilon": REQUIRED,
        "targeted": False,
        "lower_bound": -math.inf,
        "upper_bound": math.inf,
        "mask": None,
    },
    "pgd": {
        "radius": REQUIRED,
        "step_size": REQUIRED,
        "step_num": REQUIRED,
        "norm": "Linf",
        "targeted": False,
        "random_start": False,
        "seed": None,
        "lower_bound": -math.inf,
        "upper_bound": math.inf,
        "mask": None,
    },
}


#: the ranges of the numeric parameters of the attacks and the counterfactual searches (what a
#: budget, a step, a count or a search's start means): checked here, and published in the
#: HTTP schema of their params (``service.robustness.protocol``)
BOUNDS: dict[str, tuple[str, float]] = {
    "epsilon": (">=", 0),
    "radius": (">=", 0),
    "step_size": (">=", 0),
    "step_num": (">=", 1),
    "arg_min": (">=", 0),
    "arg_step": (">", 0),
}


def check_bounds(params: dict[str, Any]) -> None:
    """Each bounded number of ``params`` within its range (``BOUNDS``; NaN is in none)."""
    for name, (op, bound) in BOUNDS.items():
        v = params.get(name)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # absent, or a type error said elsewhere
        if not (v >= bound if op == ">=" else v > bound):
            raise InvalidArgumentError(f"{name} must be {op} {bound:g}, got {v}", argument=name)


@dataclass
class AttackResult:
    """``perturbed``: the inputs' form; ``predictions``: the model's output on them;
    ``flipped``: per example, whether the top class changed from the unperturbed input's;
    ``zero_gradient``: per example, whether the loss's gradient was zero (every element its
    mask lets move within ``ZERO_THRESHOLD``) at every step, so that no step moved it (a
    random start may have)."""

    perturbed: Tensor | tuple[Tensor, ...]
    predictions: Tensor
    flipped: Tensor
    zero_gradient: Tensor


def with_defaults(
    argument: str, name: str, table: dict[str, dict[str, Any]], params: dict[str, Any]
) -> dict[str, Any]:
    """``params`` of ``name`` (one of ``table``'s, given as ``argument``), each default filled
    in; an unknown name or parameter is refused, naming what is known."""
    if name not in table:
        raise InvalidArgumentError(
            f"{argument} must be one of {list(table)}, got {name!r}", argument=argument
        )
    known = table[name]
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise UnknownParameterError(
            f"{name} takes no parameter {unknown[0]!r}; it takes {list(known)}",
            argument=unknown[0],
        )
    return {**known, **params}


def check_params(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The method's parameters with their defaults, each checked."""
    p = with_defaults("method", method, PARAMS, params)
    missing = [k for k, v in p.items() if v is REQUIRED]
    if missing:
        raise InvalidArgumentError(f"{method} needs {missing[0]}", argument=missing[0])
    for name in ("epsilon", "radius", "step_size", "lower_bound", "upper_bound"):
        if name in p and (isinstance(p[name], bool) or not isinstance(p[name], (int, float))):
            raise InvalidTypeError(f"{name} must be a number, got {p[name]!r}", argument=name)
    check_bounds(p)  # budgets and steps: a sign would turn the attack around
    if p["lower_bound"] > p["upper_bound"]:
        raise InvalidArgumentError(
            f"lower_bound {p['lower_bound']} is above upper_bound {p['upper_bound']}",
            argument="lower_bound",
        )
    if method == "pgd":
        n = p["step_num"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError(
                f"step_num must be an integer >= 1, got {n!r}", argument="step_num"
            )
        if p["norm"] not in ("Linf", "L2"):
            raise InvalidArgumentError(
                f"norm must be 'Linf' or 'L2', got {p['norm']!r}", argument="norm"
            )
    for name in ("targeted", "random_start"):
        if name in p and not isinstance(p[name], bool):
            raise InvalidTypeError(f"{name} must be true or false", argument=name)
    return p


def check_masks(mask: Any, xs: Tensors) -> tuple[Tensor | float, ...]:
    if mask is None:
        return (1.0,) * len(xs)
    found = mask if isinstance(mask, (tuple, list)) else (mask,)
    if len(found) != len(xs) or not all(isinstance(m, Tensor) for m in found):
        raise InvalidArgumentError(
            f"mask must be one tensor per input ({len(xs)}), of the input's shape",
            argument="mask",
        )
    for m, x in zip(found, xs, strict=True):
        try:
            torch.broadcast_shapes(m.shape, x.shape)
        except RuntimeError:
            raise InvalidArgumentError(
                f"a mask of shape {tuple(m.shape)} does not fit an input of shape {tuple(x.shape)}",
                argument="mask",
            ) from None
    return tuple(m.to(x.dtype) for m, x in zip(found, xs, strict=True))


def _margin(out: Tensor, target: Target) -> Tensor:
    """Per example, the largest other output minus the target's: the other classes are the
    target's neighbours along dim 1 (as the cross-entropy's softmax runs)."""
    n = out.shape[0]
    if target.form == "none" or out.dim() < 2 or out.shape[1] < 2:
        raise InvalidArgumentError(
            "margin compares the target's output with the other classes': it takes an output "
            "of shape (N, C, ...) with C >= 2 and a target class",
            argument="loss",
        )
    per_row = out[0].numel()
    where = torch.arange(out.numel(), device=out.device).reshape(out.shape)
    at = target.select(where) - torch.arange(n, device=out.device) * per_row
    hit = torch.zeros(n, per_row, dtype=torch.bool, device=out.device)
    hit = hit.scatter(1, at.unsqueeze(1), True).reshape(out.shape)
    others = hit.any(dim=1, keepdim=True).expand_as(out) & ~hit
    best = out.masked_fill(~others, -math.inf).reshape(n, -1).amax(dim=1)
    return best - out.reshape(n, -1).gather(1, at.unsqueeze(1)).squeeze(1)


def _loss(out: Tensor, target: Target, loss: str) -> Tensor:
    """Each example's loss, summed over the batch."""
    if loss == "margin":
        return _margin(out, target).sum()
    if loss == "cross_entropy":
        if out.dim() < 2:
            raise InvalidArgumentError(
                "cross_entropy takes logits of shape (N, C, ...)", argument="loss"
            )
        out = F.log_softmax(out, dim=1)
        return -target.select(out).sum()
    chosen = target.select(out)
    if bool((chosen.detach() <= 0).any()):  # -log is NaN or inf: every gradient lost
        raise InvalidArgumentError(
            "loss 'nll' is -log(output[target]), for a model that returns probabilities; "
            "this model's output at the target is not positive (logits?): use "
            "loss='cross_entropy'",
            argument="loss",
        )
    return -torch.log(chosen).sum()


def loss_gradients(
    forward: Forward, xs: Tensors, target: Target, loss: str
) -> tuple[Tensors, Tensor]:
    """d(summed per-example loss)/d(inputs), and the model's output on ``xs``."""
    with torch.enable_grad():
        leaves = tuple(x.detach().requires_grad_() for x in xs)
        out = forward(leaves)
        return torch.autograd.grad(_loss(out, target, loss), leaves), out.detach()


def moving(grads: Tensors, masks: tuple[Tensor | float, ...]) -> Tensor:
    """Per example, whether any element of its gradient (over every input) that its mask
    lets move is above the zero threshold, so that a sign step moves it."""
    live = [
        ((g.abs() > ZERO_THRESHOLD) & (torch.as_tensor(m, device=g.device) != 0))
        .reshape(g.shape[0], -1)
        .any(dim=1)
        for g, m in zip(grads, masks, strict=True)
    ]
    return functools.reduce(torch.logical_or, live)


def fgsm_step(
    forward: Forward,
    xs: Tensors,
    target: Target,
    loss: str,
    epsilon: float | Tensors,
    targeted: bool,
    masks: tuple[Tensor | float, ...],
) -> tuple[Tensors, Tensor, Tensor]:
    """One FGSM step (``epsilon`` a number, or per input a tensor broadcasting against it),
    the model's output before it, and per example whether its gradient could move it."""
    grads, out = loss_gradients(forward, xs, target, loss)
    return sign_step(xs, grads, epsilon, targeted, masks), out, moving(grads, masks)


def sign_step(
    xs: Tensors,
    grads: Tensors,
    epsilon: float | Tensors,
    targeted: bool,
    masks: tuple[Tensor | float, ...],
) -> Tensors:
    sign = -1.0 if targeted else 1.0
    eps: tuple[float | Tensor, ...] = (
        epsilon if isinstance(epsilon, tuple) else (epsilon,) * len(xs)
    )
    return tuple(
        torch.where(g.abs() > ZERO_THRESHOLD, x + sign * e * torch.sign(g) * m, x)
        for x, g, e, m in zip(xs, grads, eps, masks, strict=True)
    )


def _random_point(
    center: Tensor, radius: float, norm: str, mask: Tensor | float, generator: torch.Generator
) -> Tensor:
    """A uniform point of the ball of ``radius`` around each example (as Captum draws it)."""
    if norm == "L2":
        u = torch.randn(center.shape, generator=generator, dtype=center.dtype).to(center.device)
        unit = F.normalize(u.view(u.size(0), -1)).view(u.size())
        d = center[0].numel()
        r = torch.rand(u.size(0), generator=generator, dtype=center.dtype).to(center.device)
        r = (r ** (1.0 / d) * radius)[(...,) + (None,) * (center.dim() - 1)]
        return center + r * unit * mask
    x = torch.rand(center.shape, generator=generator, dtype=center.dtype).to(center.device)
    return center + (x * radius * 2 - radius) * mask


def _top(out: Tensor) -> Tensor:
    return out.reshape(out.shape[0], -1).argmax(dim=1)


def attack(
    model: Any,
    inputs: Any,
    method: str,
    *,
    target: Any,
    additional_forward_args: Any = None,
    loss: str = "nll",
    **params: Any,
) -> AttackResult:
    """Perturb ``inputs`` against ``model``'s ``target`` (the true labels; with
    ``targeted=True``, the class to reach) by ``method`` ("fgsm" or "pgd")."""
    if not callable(model):
        raise InvalidTypeError("model must be a torch.nn.Module or a callable", argument="model")
    if loss not in LOSSES:
        raise InvalidArgumentError(
            f"loss must be one of {list(LOSSES)}, got {loss!r}", argument="loss"
        )
    p = check_params(method, params)
    xs, as_tuple = format_inputs(inputs)
    n = int(xs[0].shape[0])
    masks = check_masks(p["mask"], xs)
    tgt = make_target(target, n)
    if method == "pgd" and p["random_start"]:
        p = drawn_seed(p)
    run = functools.partial(
        _attack, model, method, p, xs, masks, tgt, additional_forward_args, loss
    )
    # a conv net's forwards run channels-last
    perturbed, before, after, moved = layout.either(model, xs, f"attack.{method}", run)
    return AttackResult(
        perturbed=restore_form(perturbed, as_tuple),
        predictions=after,
        flipped=_top(after) != _top(before),
        zero_gradient=~moved,
    )


def _attack(
    model: Any,
    method: str,
    p: dict[str, Any],
    xs: Tensors,
    masks: tuple[Tensor | float, ...],
    tgt: Target,
    additional_forward_args: Any,
    loss: str,
    channels_last: bool,
) -> tuple[Tensors, Tensor, Tensor, Tensor]:
    """The attack's perturbed inputs, the model's outputs before and after, and per example
    whether a gradient moved it; with ``channels_last``, image batches reach the model
    channels-last."""
    forward = Forward(model, format_args(additional_forward_args), channels_last=channels_last)
    low, high = p["lower_bound"], p["upper_bound"]

    def bound(t: Tensor) -> Tensor:
        return torch.clamp(t, min=low, max=high)

    with model_guard(model):
        if method == "fgsm":
            out, before, moved = fgsm_step(
                forward, xs, tgt, loss, p["epsilon"], p["targeted"], masks
            )
            perturbed = tuple(bound(t).detach() for t in out)
        else:
            start = None
            if p["random_start"]:
                g = torch.Generator()
                g.manual_seed(int(p["seed"]))
                start = tuple(
                    bound(_random_point(x, p["radius"], p["norm"], m, g))
                    for x, m in zip(xs, masks, strict=True)
                )
            perturbed, first, moved = pgd(
                forward,
                xs,
                tgt,
                loss,
                p["radius"],
                p["step_size"],
                p["step_num"],
                p["norm"],
                p["targeted"],
                masks,
                bound,
                start,
            )
            if start is None:  # the first step's forward ran on the inputs themselves
                before = first
            else:
                with torch.no_grad():
                    before = forward(xs)
        with torch.no_grad():
            after = forward(perturbed)
    # a 4-D output of a channels-last run is laid out as the as-given one (as methods.attribute)
    return perturbed, before.detach().contiguous(), after.detach().contiguous(), moved


def drawn_seed(p: dict[str, Any]) -> dict[str, Any]:
    """``p`` with its ``seed``, where None, drawn now (as ``torch.Generator.seed`` draws
    one), so that a run as given after a failed channels-last try (``layout.either``)
    draws what the try drew."""
    return p if p["seed"] is not None else {**p, "seed": torch.Generator().seed()}


def per_example(value: float | Tensor, x: Tensor) -> Tensor:
    """A scalar, or one value per example, shaped to broadcast against ``x``'s examples."""
    t = torch.as_tensor(value, dtype=x.dtype, device=x.device)
    return t.reshape(-1, *([1] * (x.dim() - 1))) if t.dim() else t


def _project(center: Tensor, moved: Tensor, radius: float | Tensor, norm: str) -> Tensor:
    """Back onto the ball of ``radius`` (per example when a tensor) around ``center``: clamped
    (Linf), or scaled as ``torch.renorm(diff, 2, 0, radius)`` scales (L2)."""
    diff = moved - center
    r = per_example(radius, center)
    if norm == "Linf":
        return center + torch.maximum(torch.minimum(diff, r), -r)
    norms = per_example(diff.reshape(diff.shape[0], -1).norm(dim=1), diff)
    return center + torch.where(norms > r, diff * (r / (norms + 1e-7)), diff)


def pgd(
    forward: Forward,
    xs: Tensors,
    target: Target,
    loss: str,
    radius: float | Tensor,
    step_size: float | Tensor,
    step_num: int,
    norm: str,
    targeted: bool,
    masks: tuple[Tensor | float, ...],
    bound: Any,
    start: Tensors | None = None,
) -> tuple[Tensors, Tensor, Tensor]:
    """PGD's steps from ``start`` (default: the inputs), the model's output at the start, and
    per example whether any step's gradient could move it; ``radius`` and ``step_size`` may be
    one value per example."""
    perturbed = xs if start is None else start
    first: Tensor | None = None
    moved = torch.zeros(int(xs[0].shape[0]), dtype=torch.bool, device=xs[0].device)
    for _ in range(step_num):
        checkpoint()
        steps = tuple(per_example(step_size, x) for x in xs)
        stepped, out, live = fgsm_step(forward, perturbed, target, loss, steps, targeted, masks)
        moved |= live
        first = out if first is None else first
        perturbed = tuple(
            bound(_project(x, s, radius, norm)).detach() for x, s in zip(xs, stepped, strict=True)
        )
    if first is None:
        raise InvalidArgumentError("step_num must be an integer >= 1", argument="step_num")
    return perturbed, first, moved
