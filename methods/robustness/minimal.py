"""The least perturbation that changes a prediction: Captum's ``MinParamPerturbation``, per
example, ``methods.min_perturbation``.

A perturbation has one parameter: ``gaussian_noise`` (the noise's std: the inputs plus std
times one standard normal draw per example, drawn once from a generator seeded with ``seed``,
so a larger std moves the same way further), ``fgsm`` (epsilon), ``pgd`` (the radius; steps
of ``step_size``, default 2.5 radius / step_num, ``step_num`` default 10) and
``feature_ablation`` (how many features are replaced by ``baselines``, default 0, most
important first by ``attribution_method``'s attributions (default saliency), summed over each
group of ``feature_mask`` where given, else single elements). An example flips when the
model's top class is not ``target`` (Captum's default ``correct_fn``). The search is Captum's:
``linear`` tries ``arg_min``, ``arg_min + arg_step``, ... below ``arg_max``; ``binary`` halves
the range as Captum does. Captum searches for the whole batch at once (a parameter succeeds
when any example flips); ours searches for each example, as Captum on that example alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine import layout
from methods.engine.guard import model_guard
from methods.engine.inputs import Forward, Tensors, format_args, format_inputs, restore_form
from methods.engine.targets import make_target
from methods.errors import InvalidArgumentError, InvalidTypeError
from methods.robustness.attack import (
    LOSSES,
    check_bounds,
    check_masks,
    drawn_seed,
    loss_gradients,
    per_example,
    pgd,
    sign_step,
    with_defaults,
)

OWN_PARAMS: dict[str, dict[str, Any]] = {
    "gaussian_noise": {"seed": None},
    "fgsm": {
        "targeted": False,
        "lower_bound": -math.inf,
        "upper_bound": math.inf,
        "mask": None,
        "loss": "nll",
    },
    "pgd": {
        "step_size": None,
        "step_num": 10,
        "norm": "Linf",
        "targeted": False,
        "lower_bound": -math.inf,
        "upper_bound": math.inf,
        "mask": None,
        "loss": "nll",
    },
    "feature_ablation": {
        "attribution_method": "saliency",
        "attribution_params": None,
        "feature_mask": None,
        "baselines": 0.0,
    },
}

#: a perturbation with its parameter per example: (params (n,), example rows) -> inputs
Perturb = Callable[[Tensor, Tensor], Tensors]


@dataclass
class MinPerturbationResult:
    """``perturbed``: the inputs' form, each example as its least flipping perturbation left
    it (unchanged where nothing in range flips it); ``min_param``: per example, the least
    parameter that flips it, or None; ``predictions``: the model's output on ``perturbed``."""

    perturbed: Tensor | tuple[Tensor, ...]
    min_param: list[float | None]
    predictions: Tensor


def _check(perturbation: str, params: dict[str, Any]) -> dict[str, Any]:
    p = with_defaults("perturbation", perturbation, OWN_PARAMS, params)
    if p.get("loss", "nll") not in LOSSES:
        raise InvalidArgumentError(f"loss must be one of {list(LOSSES)}", argument="loss")
    for name in ("step_size", "lower_bound", "upper_bound"):
        if name not in p or (name == "step_size" and p[name] is None):  # None: from the radius
            continue
        v = p[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise InvalidTypeError(f"{name} must be a number, got {v!r}", argument=name)
    check_bounds(p)
    if p.get("lower_bound", -math.inf) > p.get("upper_bound", math.inf):
        raise InvalidArgumentError(
            f"lower_bound {p['lower_bound']} is above upper_bound {p['upper_bound']}",
            argument="lower_bound",
        )
    if perturbation == "pgd":
        n = p["step_num"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidArgumentError("step_num must be an integer >= 1", argument="step_num")
        if p["norm"] not in ("Linf", "L2"):
            raise InvalidArgumentError("norm must be 'Linf' or 'L2'", argument="norm")
    return p


#: the search's own keyword arguments (``mode`` has a default)
SEARCH = ("arg_min", "arg_max", "arg_step", "mode")


def check_params(perturbation: str, params: dict[str, Any]) -> dict[str, Any]:
    """``min_perturbation``'s keyword arguments (the search's and the perturbation's), checked,
    with every default filled in: what a caller that holds no model yet can check."""
    given = {**{"mode": "linear"}, **params}
    for name in SEARCH[:3]:
        if name not in given:
            raise InvalidArgumentError(
                f"{perturbation} needs {name} (the search runs over arg_min, arg_min + "
                "arg_step, ... below arg_max)",
                argument=name,
            )
    if given["mode"] not in ("linear", "binary"):
        raise InvalidArgumentError(
            f"mode must be 'linear' or 'binary', got {given['mode']!r}", argument="mode"
        )
    _range(given["arg_min"], given["arg_max"], given["arg_step"])
    own = _check(perturbation, {k: v for k, v in given.items() if k not in SEARCH})
    return {**{k: given[k] for k in SEARCH}, **own}


def _range(arg_min: Any, arg_max: Any, arg_step: Any) -> None:
    for name, v in (("arg_min", arg_min), ("arg_max", arg_max), ("arg_step", arg_step)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InvalidTypeError(f"{name} must be a finite number, got {v!r}", argument=name)
    # every perturbation's parameter is a spread, a budget or a count: the search starts >= 0
    check_bounds({"arg_min": arg_min, "arg_step": arg_step})
    if not arg_max > arg_min + arg_step:
        raise InvalidArgumentError(
            "arg_max must exceed arg_min + arg_step (Captum's rule)", argument="arg_max"
        )


def _perturbation(
    name: str, p: dict[str, Any], model: Any, forward: Forward, xs: Tensors, target: Any
) -> Perturb:
    """The perturbation of examples ``rows`` by their parameters."""
    n = int(xs[0].shape[0])
    tgt = make_target(target, n)
    if name == "gaussian_noise":
        g = torch.Generator()
        g.manual_seed(int(p["seed"]))
        noise = tuple(torch.randn(x.shape, generator=g, dtype=x.dtype).to(x.device) for x in xs)
        return lambda v, rows: tuple(
            x[rows] + per_example(v, x[rows]) * z[rows] for x, z in zip(xs, noise, strict=True)
        )
    if name == "feature_ablation":
        return _ablation(p, model, xs, target, forward.args)
    masks = check_masks(p["mask"], xs)
    low, high = p["lower_bound"], p["upper_bound"]

    def bound(t: Tensor) -> Tensor:
        return torch.clamp(t, min=low, max=high)

    def rows_of(m: Tensor | float, rows: Tensor) -> Tensor | float:
        return m[rows] if isinstance(m, Tensor) and m.dim() and m.shape[0] == n else m

    if name == "fgsm":
        grads, _ = loss_gradients(forward, xs, tgt, p["loss"])  # the same for every epsilon

        def fgsm(v: Tensor, rows: Tensor) -> Tensors:
            sub = tuple(x[rows] for x in xs)
            eps = tuple(per_example(v, x) for x in sub)
            out = sign_step(
                sub,
                tuple(gr[rows] for gr in grads),
                eps,
                p["targeted"],
                tuple(rows_of(m, rows) for m in masks),
            )
            return tuple(bound(t).detach() for t in out)

        return fgsm

    def run_pgd(v: Tensor, rows: Tensor) -> Tensors:
        sub = tuple(x[rows] for x in xs)
        step = v * 2.5 / p["step_num"] if p["step_size"] is None else p["step_size"]
        sub_target = make_target(_rows_target(target, rows, n), len(rows))
        fwd = dataclasses.replace(forward, args=_rows_args(forward.args, rows, n))
        perturbed, _, _ = pgd(
            fwd,
            sub,
            sub_target,
            p["loss"],
            v,
            step,
            p["step_num"],
            p["norm"],
            p["targeted"],
            tuple(rows_of(m, rows) for m in masks),
            bound,
        )
        return perturbed

    return run_pgd


def _rows_target(target: Any, rows: Tensor, n: int) -> Any:
    if isinstance(target, Tensor) and target.dim() >= 1 and target.shape[0] == n and n > 1:
        return target[rows]
    if isinstance(target, list) and len(target) == n and n > 1:
        return [target[i] for i in rows.tolist()]
    return target


def _rows_args(args: tuple[Any, ...], rows: Tensor, n: int) -> tuple[Any, ...]:
    return tuple(
        a[rows] if isinstance(a, Tensor) and a.dim() and a.shape[0] == n and n > 1 else a
        for a in args
    )


def _ablation(
    p: dict[str, Any], model: Any, xs: Tensors, target: Any, args: tuple[Any, ...]
) -> Perturb:
    """Replace each example's ``k`` most important features (groups) by the baselines, as
    ranked by the attribution method run with the model's additional forward ``args``."""
    from methods.api import attribute

    inputs = xs if len(xs) > 1 else xs[0]
    params = dict(p["attribution_params"] or {})
    if args and "additional_forward_args" not in params:
        params["additional_forward_args"] = args
    attrs = attribute(model, inputs, p["attribution_method"], target=target, **params).attributions
    attrs = attrs if isinstance(attrs, tuple) else (attrs,)
    n = int(xs[0].shape[0])
    mask = p["feature_mask"]
    masks = (mask if isinstance(mask, tuple) else (mask,)) if mask is not None else None
    # each element's group id (per example), and each group's summed attribution
    ids, offset = [], 0
    for i, x in enumerate(xs):
        if masks is None:
            g = torch.arange(x[0].numel(), device=x.device).reshape(x.shape[1:]) + offset
            offset += x[0].numel()
        else:
            m = masks[i].to(torch.long)
            if m.dim() == x.dim():  # a batch dim: one mask for every example
                if m.shape[0] != 1:
                    raise InvalidArgumentError(
                        "feature_mask must be one mask for all examples (batch dim 1, or "
                        "none): the features are ranked once per example over the same groups",
                        argument="feature_mask",
                    )
                m = m[0]
            try:
                g = m.expand(x.shape[1:])
            except RuntimeError:
                raise InvalidArgumentError(
                    f"a feature_mask of shape {tuple(masks[i].shape)} does not fit an input of "
                    f"shape {tuple(x.shape)}",
                    argument="feature_mask",
                ) from None
        ids.append(g.reshape(-1))
    flat_ids = torch.cat(ids)
    n_groups = int(flat_ids.max()) + 1
    flat_attr = torch.cat([a.reshape(n, -1) for a in attrs], dim=1).to(torch.float64)
    scores = torch.zeros(n, n_groups, dtype=torch.float64, device=flat_attr.device)
    scores.index_add_(1, flat_ids.to(flat_attr.device), flat_attr)
    present = torch.zeros(n_groups, dtype=torch.bool)
    present[flat_ids.cpu()] = True
    scores[:, ~present.to(scores.device)] = -math.inf  # ids the mask never uses
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(n_groups, device=order.device).expand(n, -1))
    baselines = p["baselines"]
    base = baselines if isinstance(baselines, tuple) else (baselines,) * len(xs)

    def ablate(v: Tensor, rows: Tensor) -> Tensors:
        k = v.to(torch.long).reshape(-1, 1)
        out, start = [], 0
        for x, b in zip(xs, base, strict=True):
            size = x[0].numel()
            element_rank = rank[rows][:, flat_ids[start : start + size]]
            drop = (element_rank < k).reshape(x[rows].shape)
            b_rows = (
                b[rows] if isinstance(b, Tensor) and b.dim() == x.dim() and b.shape[0] == n else b
            )
            out.append(
                torch.where(
                    drop,
                    torch.as_tensor(b_rows, dtype=x.dtype, device=x.device)
                    if not isinstance(b_rows, Tensor)
                    else b_rows.to(x.dtype),
                    x[rows],
                )
            )
            start += size
        return tuple(out)

    return ablate


def _flips(forward: Forward, xs: Tensors, target: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Which of the perturbed examples ``xs`` (rows ``rows``) no longer have ``target`` on top,
    and the model's output on them."""
    with torch.no_grad():
        args = _rows_args(forward.args, rows, int(target.shape[0]))
        out = dataclasses.replace(forward, args=args)(xs)
    if out.dim() != 2:
        raise InvalidArgumentError(
            "min_perturbation needs an output of shape (N, classes): a flip is the top class "
            "changing from target",
            argument="model",
        )
    return out.argmax(dim=1) != target[rows].to(out.device), out


def min_perturbation(
    model: Any,
    inputs: Any,
    perturbation: str,
    *,
    target: Any,
    arg_min: float,
    arg_max: float,
    arg_step: float,
    mode: str = "linear",
    additional_forward_args: Any = None,
    **params: Any,
) -> MinPerturbationResult:
    """Per example, the least parameter of ``perturbation`` in ``[arg_min, arg_max)`` (by
    ``arg_step``) whose perturbed input the model no longer gives class ``target``."""
    ranged = {"arg_min": arg_min, "arg_max": arg_max, "arg_step": arg_step, "mode": mode}
    p = check_params(perturbation, {**ranged, **params})
    xs, as_tuple = format_inputs(inputs)
    n = int(xs[0].shape[0])
    tgt = make_target(target, n)
    if tgt.form not in ("index", "per_example") or len(tgt.index) > 1:
        raise InvalidArgumentError(
            "target must be a class index, or one per example", argument="target"
        )
    classes = tgt.rows if tgt.rows is not None else torch.full((n,), int(tgt.index[0]))
    if perturbation == "gaussian_noise":
        p = drawn_seed(p)

    def run(channels_last: bool) -> tuple[list[float | None], Tensors, Tensor]:
        args = format_args(additional_forward_args)
        forward = Forward(model, args, channels_last=channels_last)
        with model_guard(model):
            perturb = _perturbation(perturbation, p, model, forward, xs, target)
            found: list[float | None] = [None] * n
            best: list[Tensors | None] = [None] * n
            search = _linear if mode == "linear" else _binary
            search(perturb, forward, classes, n, arg_min, arg_max, arg_step, found, best)
            perturbed = tuple(
                torch.stack([_row(best[i], j, x[i]) for i in range(n)]) for j, x in enumerate(xs)
            )
            with torch.no_grad():
                predictions = forward(perturbed)
        return found, perturbed, predictions

    # a conv net's forwards run channels-last
    found, perturbed, predictions = layout.either(
        model,
        xs,
        f"min_perturbation.{perturbation}",
        run,
        gradients=perturbation != "gaussian_noise",
    )
    return MinPerturbationResult(restore_form(perturbed, as_tuple), found, predictions.detach())


def _row(found: Tensors | None, j: int, unchanged: Tensor) -> Tensor:
    return unchanged if found is None else found[j]


def _record(
    flipped: Tensor,
    rows: Tensor,
    values: list[float],
    xs: Tensors,
    found: list[float | None],
    best: list[Tensors | None],
) -> None:
    for j, i in enumerate(rows.tolist()):
        known = found[i]
        if bool(flipped[j]) and (known is None or values[j] < known):
            found[i] = values[j]
            best[i] = tuple(x[j] for x in xs)


def _linear(
    perturb: Perturb,
    forward: Forward,
    classes: Tensor,
    n: int,
    lo: float,
    hi: float,
    step: float,
    found: list[float | None],
    best: list[Tensors | None],
) -> None:
    """Captum's linear search (``drange``: lo, lo + step, ... below hi), for every example
    still unflipped at once."""
    value = lo
    while value < hi:
        checkpoint()
        rows = torch.tensor([i for i in range(n) if found[i] is None], dtype=torch.long)
        if not len(rows):
            return
        xs = perturb(torch.full((len(rows),), float(value), dtype=torch.float64), rows)
        flipped, _ = _flips(forward, xs, classes, rows)
        _record(flipped, rows, [value] * len(rows), xs, found, best)
        value += step


def _binary(
    perturb: Perturb,
    forward: Forward,
    classes: Tensor,
    n: int,
    lo: float,
    hi: float,
    step: float,
    found: list[float | None],
    best: list[Tensors | None],
) -> None:
    """Captum's binary search, run for each example (its mids depend on its own flips), all
    examples still searching evaluated together."""
    low, high = [lo] * n, [hi] * n
    active = set(range(n))
    while active:
        checkpoint()
        rows_list = sorted(i for i in active if high[i] > low[i])
        active = set(rows_list)
        if not rows_list:
            return
        mids = []
        for i in rows_list:
            mid_step = ((high[i] - low[i]) // step) // 2
            if mid_step == 0 and low[i] + step < high[i]:
                mid_step = 1
            mids.append(low[i] + mid_step * step)
        rows = torch.tensor(rows_list, dtype=torch.long)
        xs = perturb(torch.tensor(mids, dtype=torch.float64), rows)
        flipped, _ = _flips(forward, xs, classes, rows)
        _record(flipped, rows, mids, xs, found, best)
        for j, i in enumerate(rows_list):
            mid = mids[j]
            if bool(flipped[j]):
                high[i] = mid
            if math.isclose(low[i], mid):
                active.discard(i)
                continue
            if not bool(flipped[j]):
                low[i] = mid
