"""Explanation metrics with Captum's semantics: infidelity and max-sensitivity.

Yeh et al. 2019, https://arxiv.org/abs/1901.09392. Both evaluate ``n_perturb_samples``
perturbations per example (copies of an example kept together), in chunks of at most
``max_examples_per_batch`` rows, under no_grad for the model.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine.inputs import Forward, format_args, format_inputs
from methods.engine.targets import make_target
from methods.errors import InvalidArgumentError, InvalidTypeError

TensorOrTuple = Tensor | tuple[Tensor, ...]


def _sample_chunks(n: int, n_samples: int, max_rows: int | None) -> list[int]:
    """Samples per chunk, as Captum's ``_divide_and_aggregate_metrics`` splits them."""
    if not isinstance(n_samples, int) or isinstance(n_samples, bool) or n_samples < 1:
        raise InvalidArgumentError(
            f"n_perturb_samples must be an integer >= 1, got {n_samples!r}",
            argument="n_perturb_samples",
        )
    if max_rows is None:
        per = n_samples
    else:
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise InvalidArgumentError(
                f"max_examples_per_batch must be None or an integer >= 1, got {max_rows!r}",
                argument="max_examples_per_batch",
            )
        per = min(max(max_rows // n, 1), n_samples)
    sizes = [per] * (n_samples // per)
    if n_samples % per:
        sizes.append(n_samples % per)
    return sizes


def _interleave(xs: tuple[Any, ...], k: int) -> tuple[Any, ...]:
    return tuple(
        x.repeat_interleave(k, dim=0) if isinstance(x, Tensor) and x.dim() >= 1 else x for x in xs
    )


def _tuple(value: Any, what: str) -> tuple[Tensor, ...]:
    if isinstance(value, Tensor):
        return (value,)
    if isinstance(value, (tuple, list)) and all(isinstance(v, Tensor) for v in value):
        return tuple(value)
    raise InvalidTypeError(
        f"{what} must be a Tensor or a tuple of Tensors, got {type(value).__name__}",
        argument=what,
    )


def infidelity(
    forward_func: Callable[..., Any],
    perturb_func: Callable[..., Any],
    inputs: TensorOrTuple,
    attributions: TensorOrTuple,
    baselines: Any = None,
    additional_forward_args: Any = None,
    target: Any = None,
    n_perturb_samples: int = 10,
    max_examples_per_batch: int | None = None,
    normalize: bool = False,
) -> Tensor:
    """Expected squared error between attributions . perturbation and the output change.

    ``perturb_func(inputs[, baselines])`` returns ``(perturbations, perturbed_inputs)``;
    per example, infidelity = mean over samples of (sum(attr * I) - (f(x) - f(x - I)))^2.
    With ``normalize`` the attributions are first rescaled by the least-squares factor beta.
    One value per example.
    """
    xs, _ = format_inputs(inputs)
    attrs = _tuple(attributions, "attributions")
    if len(attrs) != len(xs) or any(a.shape != x.shape for a, x in zip(attrs, xs, strict=False)):
        raise InvalidArgumentError(
            "attributions must match inputs tensor for tensor and shape for shape: inputs "
            f"{[tuple(x.shape) for x in xs]}, attributions {[tuple(a.shape) for a in attrs]}",
            argument="attributions",
        )
    n = int(xs[0].shape[0])
    args = format_args(additional_forward_args)
    base: tuple[Any, ...] | None = None
    if baselines is not None:
        base = tuple(baselines) if isinstance(baselines, (tuple, list)) else (baselines,) * len(xs)
        if len(base) != len(xs):
            raise InvalidArgumentError(
                f"baselines has {len(base)} entries for {len(xs)} inputs", argument="baselines"
            )
    tgt = make_target(target, n)
    with torch.no_grad():
        fx = tgt.select(Forward(forward_func, args)(xs))
        totals: list[Tensor] | None = None
        for k in _sample_chunks(n, n_perturb_samples, max_examples_per_batch):
            checkpoint()
            x_exp = _interleave(xs, k)
            b_exp = None
            if base is not None:
                b_exp = tuple(
                    b.repeat_interleave(k, dim=0)
                    if isinstance(b, Tensor) and b.dim() >= 1 and b.shape[0] == n and n > 1
                    else b
                    for b in base
                )
            single = len(x_exp) == 1
            arg_in = x_exp[0] if single else x_exp
            if b_exp is None:
                res = perturb_func(arg_in)
            else:
                res = perturb_func(arg_in, b_exp[0] if single else b_exp)
            if not isinstance(res, (tuple, list)) or len(res) != 2:
                raise InvalidTypeError(
                    "perturb_func must return (perturbations, perturbed_inputs); wrap a function "
                    "returning only perturbed inputs with "
                    "methods.metrics.infidelity_perturb_func_decorator",
                    argument="perturb_func",
                )
            pert = _tuple(res[0], "perturbations")
            perturbed = _tuple(res[1], "perturbed_inputs")
            if len(pert) != len(xs) or len(perturbed) != len(xs):
                raise InvalidArgumentError(
                    "perturb_func must return one perturbation and one perturbed input per input",
                    argument="perturb_func",
                )
            f_pert = tgt.expand(k, interleave=True).select(
                Forward(forward_func, _interleave(args, k))(perturbed)
            )
            diffs = (fx.repeat_interleave(k) - f_pert).reshape(n, k)
            s = sum(
                (a.repeat_interleave(k, dim=0) * p).reshape(n * k, -1).sum(1)
                for a, p in zip(attrs, pert, strict=True)
            ).reshape(n, k)  # type: ignore[union-attr]
            s = s.to(diffs.dtype) if s.dtype != diffs.dtype else s
            parts = (
                [(s * s).sum(1), (s * diffs).sum(1), (diffs * diffs).sum(1)]
                if normalize
                else [((s - diffs) ** 2).sum(1)]
            )
            totals = (
                parts if totals is None else [t + q for t, q in zip(totals, parts, strict=True)]
            )
    if totals is None:  # no chunk ran: only possible with no samples at all
        raise InvalidArgumentError("n_perturb_samples must be >= 1", argument="n_perturb_samples")
    if normalize:
        ss, sd, dd = totals
        beta = torch.where(ss == 0, torch.zeros_like(sd), sd / torch.where(ss == 0, 1, ss))
        values = beta * beta * ss - 2 * beta * sd + dd
    else:
        values = totals[0]
    return values / n_perturb_samples


def infidelity_perturb_func_decorator(
    multiply_by_inputs: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn ``f(inputs[, baselines]) -> perturbed_inputs`` into an infidelity perturb_func.

    The perturbation is (x - x_pert) / (x - baseline) (or / x without baselines, 0 where the
    denominator is 0) when ``multiply_by_inputs``, else x - x_pert; as Captum's decorator.
    """

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(inputs: Any, baselines: Any = None) -> tuple[Any, Any]:
            perturbed = fn(inputs) if baselines is None else fn(inputs, baselines)
            xs = _tuple(inputs, "inputs")
            ps = _tuple(perturbed, "perturbed_inputs")
            bs = _tuple(baselines, "baselines") if isinstance(baselines, (Tensor, tuple)) else None
            out = []
            for i, (x, xp) in enumerate(zip(xs, ps, strict=True)):
                d = x - xp
                if multiply_by_inputs:
                    den = (
                        x - bs[i]
                        if bs is not None
                        else (x - baselines if baselines is not None else x)
                    )
                    d = torch.where(
                        den == 0, torch.zeros_like(d), d / torch.where(den == 0, 1, den)
                    )
                out.append(d)
            single = isinstance(inputs, Tensor)
            return (out[0] if single else tuple(out)), perturbed

        return wrapped

    return deco


def default_perturb_func(inputs: TensorOrTuple, perturb_radius: float = 0.02) -> TensorOrTuple:
    """Uniform noise in [-perturb_radius, perturb_radius], in each input's own dtype."""
    xs = _tuple(inputs, "inputs")
    out = tuple(x + torch.empty_like(x).uniform_(-perturb_radius, perturb_radius) for x in xs)
    return out[0] if isinstance(inputs, Tensor) else out


def sensitivity_max(
    explanation_func: Callable[..., Any],
    inputs: TensorOrTuple,
    perturb_func: Callable[..., Any] = default_perturb_func,
    perturb_radius: float = 0.02,
    n_perturb_samples: int = 10,
    norm_ord: Any = "fro",
    max_examples_per_batch: int | None = None,
    **kwargs: Any,
) -> Tensor:
    """Largest relative change of the explanation under small input perturbations.

    Per example: max over samples of ||e(x) - e(x')|| / ||e(x)|| (all tensors flattened and
    concatenated; a zero denominator counts as 1). ``kwargs`` go to ``explanation_func``;
    per-example tensors among them (target lists, additional_forward_args, baselines shaped
    like the inputs) are expanded alongside the perturbed copies, as in Captum.
    """
    xs, as_tuple = format_inputs(inputs)
    n = int(xs[0].shape[0])
    takes_radius = len(inspect.signature(perturb_func).parameters) > 1
    form = (lambda ts: ts) if as_tuple else (lambda ts: ts[0])

    with torch.no_grad():
        base = _tuple(explanation_func(form(xs), **kwargs), "explanation")
    flat = torch.cat([e.reshape(n, -1) for e in base], dim=1)
    norm = torch.linalg.norm(flat, ord=norm_ord, dim=1) if norm_ord != "fro" else flat.norm(dim=1)
    norm = torch.where(norm == 0, torch.ones_like(norm), norm)
    best: Tensor | None = None
    for k in _sample_chunks(n, n_perturb_samples, max_examples_per_batch):
        checkpoint()
        x_exp = _interleave(xs, k)
        arg = form(x_exp)
        perturbed = perturb_func(arg, perturb_radius) if takes_radius else perturb_func(arg)
        kw = _expand_kwargs(kwargs, xs, n, k)
        with torch.no_grad():
            expl = _tuple(explanation_func(perturbed, **kw), "explanation")
        diff = torch.cat(
            [
                (b.repeat_interleave(k, dim=0) - e).reshape(n * k, -1)
                for b, e in zip(base, expl, strict=True)
            ],
            dim=1,
        )
        dn = torch.linalg.norm(diff, ord=norm_ord, dim=1) if norm_ord != "fro" else diff.norm(dim=1)
        sens = (dn / norm.repeat_interleave(k)).reshape(n, k).max(1).values
        best = sens if best is None else torch.maximum(best, sens)
    if best is None:  # no chunk ran: only possible with no samples at all
        raise InvalidArgumentError("n_perturb_samples must be >= 1", argument="n_perturb_samples")
    return best


def _expand_kwargs(
    kwargs: dict[str, Any], xs: tuple[Tensor, ...], n: int, k: int
) -> dict[str, Any]:
    out = dict(kwargs)
    if "additional_forward_args" in out and out["additional_forward_args"] is not None:
        args = format_args(out["additional_forward_args"])
        out["additional_forward_args"] = _interleave(args, k)
    if "target" in out:
        t = out["target"]
        if isinstance(t, list):
            out["target"] = [v for v in t for _ in range(k)]
        elif isinstance(t, Tensor) and t.numel() > 1:
            out["target"] = t.repeat_interleave(k, dim=0)
    if "baselines" in out:
        b = out["baselines"]
        if isinstance(b, Tensor) and b.shape == xs[0].shape:
            out["baselines"] = b.repeat_interleave(k, dim=0)
        elif isinstance(b, tuple) and b and isinstance(b[0], Tensor) and b[0].shape == xs[0].shape:
            out["baselines"] = tuple(
                v.repeat_interleave(k, dim=0) if isinstance(v, Tensor) and v.dim() >= 1 else v
                for v in b
            )
    return out
