"""``evaluate``: explanation metrics for given attributions, in one call.

Captum's (via the ports in ``methods.metrics``, Yeh et al. 2019):

- ``infidelity``: Gaussian perturbations I ~ N(0, noise_std^2) per element, the perturbed
  input is x - I; per example mean over samples of (sum(attr * I) - (f(x) - f(x - I)))^2.
  Defaults: ``noise_std=0.003`` (the noise of Captum's documented example),
  ``n_perturb_samples=10``, ``normalize=False``, ``max_examples_per_batch=None``.
- ``sensitivity_max``: re-runs ``method`` (``methods.attribute(model, x, method,
  target=..., additional_forward_args=..., **method_params)``) on inputs plus uniform noise
  in [-perturb_radius, perturb_radius]; per example the max over samples of
  ||e(x + d) - e(x)|| / ||e(x)||. Defaults: ``perturb_radius=0.02``,
  ``n_perturb_samples=10``, ``norm_ord="fro"``, ``max_examples_per_batch=None``.

The noise is drawn chunk by chunk exactly as Captum calls its ``perturb_func`` (the inputs
with each example repeated ``k`` times, ``repeat_interleave``), input by input, from a
``torch.Generator`` on ``inputs[0]``'s device seeded with ``seed``, afresh for each metric:
``torch.randn(x.shape, generator=g, dtype=x.dtype) * noise_std`` for infidelity and
``torch.empty(x.shape, dtype=x.dtype).uniform_(-r, r, generator=g)`` for sensitivity. With
``seed=None`` they come from torch's global generator (``torch.manual_seed`` governs them).

Ours (Petsiuk et al. 2018, RISE's causal metrics):

- ``deletion`` / ``insertion``: features ranked most important first by their attribution
  (a group of ``feature_mask`` by its attribution sum, mask ids shared across inputs as in
  Captum; without a mask each element, except that in a 4-D input (N, C, H, W) a feature is a
  pixel position: its channels' attributions summed, all its channels replaced together).
  Ranking is joint over all inputs; ties keep index order (a stable descending sort). At step
  i = 0..steps the top ceil(i * F / steps) of the F features are replaced by ``baselines``
  (deletion, starting from the input) or taken from the input over the all-baseline input
  (insertion). The curve is the targeted raw model output (no softmax) at each step,
  ``(N, steps + 1)``; ``auc`` the trapezoid area over x = linspace(0, 1, steps + 1).
  Defaults: ``steps=20``, ``max_examples_per_batch=None`` (every row of every step in one
  forward; an int caps the rows per forward; out of memory halves the chunk and retries).
  ``baselines`` (default 0): a number or a tensor broadcastable to the input (a tuple of these
  for tuple inputs); only these two metrics use it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from methods import metrics as captum_metrics
from methods import registry
from methods.engine import layout
from methods.engine.call import Result
from methods.engine.inputs import (
    Forward,
    Tensors,
    format_args,
    format_inputs,
    images_channels_last,
    restore_form,
)
from methods.engine.targets import make_target
from methods.errors import (
    InvalidArgumentError,
    InvalidTypeError,
    UnknownParameterError,
)
from methods.evaluation import curves

__all__ = ["METRICS", "evaluate", "parse_metrics"]

Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _is_opt_int(v: Any) -> bool:
    return v is None or _is_int(v)


def _is_nonneg(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


def _is_norm(v: Any) -> bool:
    return v == "fro" or (isinstance(v, (int, float)) and not isinstance(v, bool))


_INT = (_is_int, "an integer >= 1")
_ROWS = (_is_opt_int, "None or an integer >= 1")
_CURVE: dict[str, tuple[Any, tuple[Check, str]]] = {
    "steps": (20, _INT),
    "max_examples_per_batch": (None, _ROWS),
}

#: metric -> parameter -> (default, (check, what the value must be))
METRICS: dict[str, dict[str, tuple[Any, tuple[Check, str]]]] = {
    "infidelity": {
        "noise_std": (0.003, (_is_nonneg, "a finite number >= 0")),
        "n_perturb_samples": (10, _INT),
        "normalize": (False, (lambda v: isinstance(v, bool), "a bool")),
        "max_examples_per_batch": (None, _ROWS),
    },
    "sensitivity_max": {
        "perturb_radius": (0.02, (_is_nonneg, "a finite number >= 0")),
        "n_perturb_samples": (10, _INT),
        "norm_ord": ("fro", (_is_norm, "'fro' or a number (a vector norm's order)")),
        "max_examples_per_batch": (None, _ROWS),
    },
    "deletion": _CURVE,
    "insertion": _CURVE,
}


def evaluate(
    model: Any,
    inputs: Any,
    attributions: Any,
    *,
    target: Any,
    metrics: Mapping[str, Mapping[str, Any]] | None = None,
    baselines: Any = None,
    feature_mask: Any = None,
    seed: int | None = None,
    method: str | None = None,
    method_params: Mapping[str, Any] | None = None,
    additional_forward_args: Any = None,
) -> dict[str, Any]:
    """Score ``attributions`` of ``model``'s targeted output on ``inputs`` with ``metrics``.

    ``attributions`` is a tensor (a tuple for tuple inputs) or ``methods.attribute``'s
    result, which also says how to run the method again for sensitivity_max (its method and
    the parameters it ran with), so ``method`` need not be given then.

    ``metrics`` maps metric names to their parameters (``{}`` takes the defaults; see the
    module docstring); ``None`` means infidelity, deletion and insertion, plus
    sensitivity_max when ``method`` is given. Returns only the metrics asked for:
    ``infidelity`` and ``sensitivity_max`` a Tensor[N], ``deletion`` and ``insertion``
    ``{"auc": Tensor[N], "curve": Tensor[N, steps + 1]}``.
    """
    if isinstance(attributions, Result):  # methods.attribute's answer: it says how it ran
        if method is None:
            method, method_params = attributions.method, attributions.given
        attributions = attributions.attributions
    chosen = parse_metrics(metrics, method is not None)
    xs, as_tuple = format_inputs(inputs)
    attrs = _attributions(attributions, xs)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidTypeError(f"seed must be an int or None, got {seed!r}", argument="seed")
    if not callable(model):
        raise InvalidTypeError(
            f"model must be a torch.nn.Module or a callable, got {type(model).__name__}",
            argument="model",
        )
    n = int(xs[0].shape[0])
    tgt = make_target(target, n)
    args = format_args(additional_forward_args)
    if ("infidelity" in chosen or "sensitivity_max" in chosen) and not all(
        x.is_floating_point() for x in xs
    ):
        raise InvalidTypeError(
            "infidelity and sensitivity_max add noise to the inputs, which must be "
            f"floating point; got {[str(x.dtype) for x in xs]}",
            argument="inputs",
        )
    mparams: dict[str, Any] = {}
    if "sensitivity_max" in chosen:
        mparams = _method_params(method, method_params)
    bases: Tensors = ()
    masks: Tensors = ()
    if "deletion" in chosen or "insertion" in chosen:
        bases = curves.baselines_for(baselines, xs)
        masks = curves.feature_ids(feature_mask, xs)

    def infidelity(p: dict[str, Any], channels_last: bool) -> Tensor:
        return captum_metrics.infidelity(
            _fed(model, len(xs)) if channels_last else model,
            _gaussian(_generator(seed, xs[0]), p["noise_std"]),
            restore_form(xs, as_tuple),
            attrs,
            additional_forward_args=additional_forward_args,
            target=target,
            n_perturb_samples=p["n_perturb_samples"],
            max_examples_per_batch=p["max_examples_per_batch"],
            normalize=p["normalize"],
        )

    def curve(name: str, p: dict[str, Any], channels_last: bool) -> dict[str, Tensor]:
        forward = Forward(model, args, channels_last=channels_last)
        values = curves.curve(forward, xs, attrs, masks, bases, tgt, name == "insertion", p)
        x = torch.linspace(0, 1, p["steps"] + 1, dtype=values.dtype, device=values.device)
        return {"auc": torch.trapezoid(values, x=x, dim=1), "curve": values}

    out: dict[str, Any] = {}
    for name, p in chosen.items():
        if name == "sensitivity_max":  # it runs the method, which lays out its own inputs
            out[name] = _sensitivity(
                model, xs, as_tuple, p, seed, str(method), mparams, target, additional_forward_args
            )
            continue
        run: Callable[[bool], Any] = (
            functools.partial(infidelity, p)
            if name == "infidelity"
            else functools.partial(curve, name, p)
        )
        # a conv net: NHWC; forwards only, so ties do not matter
        out[name] = layout.either(model, xs, f"metrics.{name}", run, gradients=False)
    return out


def _fed(model: Callable[..., Any], k: int) -> Callable[..., Any]:
    """``model`` with the image batches among its first ``k`` arguments channels-last."""

    def fed(*args: Any) -> Any:
        return model(*images_channels_last(args[:k]), *args[k:])

    return fed


# ----------------------------------------------------------------------------- validation


def parse_metrics(
    metrics: Mapping[str, Mapping[str, Any]] | None, has_method: bool
) -> dict[str, dict[str, Any]]:
    """``metrics`` checked, each with every parameter (defaults filled in); ``None``: the
    defaults of every metric (sensitivity_max only ``has_method``)."""
    if metrics is None:
        names = ["infidelity", "sensitivity_max", "deletion", "insertion"]
        metrics = {m: {} for m in names if has_method or m != "sensitivity_max"}
    if not isinstance(metrics, Mapping):
        raise InvalidTypeError(
            "metrics must be a dict mapping metric names to their parameters, got "
            f"{type(metrics).__name__}",
            argument="metrics",
        )
    chosen: dict[str, dict[str, Any]] = {}
    for name, given in metrics.items():
        spec = METRICS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise UnknownParameterError(
                f"unknown metric {name!r}; the metrics are: {', '.join(METRICS)}",
                argument=f"metrics.{name}",
            )
        if given is None:
            given = {}
        if not isinstance(given, Mapping):
            raise InvalidArgumentError(
                f"metrics.{name} must be a dict of parameters ({{}} for the defaults), got "
                f"{type(given).__name__}",
                argument=f"metrics.{name}",
            )
        p = {k: default for k, (default, _) in spec.items()}
        for key, value in given.items():
            if key not in spec:
                raise UnknownParameterError(
                    f"{name} has no parameter {key!r}; its parameters are: {', '.join(spec)}",
                    argument=f"metrics.{name}.{key}",
                )
            check, what = spec[key][1]
            if not check(value):
                raise InvalidArgumentError(
                    f"metrics.{name}.{key} must be {what}, got {value!r}",
                    argument=f"metrics.{name}.{key}",
                )
            p[key] = value
        chosen[name] = p
    if "sensitivity_max" in chosen and not has_method:
        raise InvalidArgumentError(
            "sensitivity_max re-runs the explanation method on perturbed inputs: pass method "
            "(a registered method name) and, if needed, method_params",
            argument="method",
        )
    return chosen


def _attributions(attributions: Any, xs: Tensors) -> Tensors:
    if isinstance(attributions, Tensor):
        attrs: Tensors = (attributions,)
    elif isinstance(attributions, (tuple, list)) and all(
        isinstance(a, Tensor) for a in attributions
    ):
        attrs = tuple(attributions)
    else:
        raise InvalidTypeError(
            "attributions must be a Tensor or a tuple of Tensors (one per input), got "
            f"{type(attributions).__name__}",
            argument="attributions",
        )
    if len(attrs) != len(xs) or any(a.shape != x.shape for a, x in zip(attrs, xs, strict=False)):
        raise InvalidArgumentError(
            "attributions must match inputs tensor for tensor and shape for shape: inputs "
            f"{[tuple(x.shape) for x in xs]}, attributions {[tuple(a.shape) for a in attrs]}",
            argument="attributions",
        )
    return tuple(a.detach() for a in attrs)


def _method_params(method: str | None, method_params: Mapping[str, Any] | None) -> dict[str, Any]:
    registry.get(str(method))  # an unknown name fails now, before any work
    if method_params is None:
        return {}
    if not isinstance(method_params, Mapping):
        raise InvalidTypeError(
            f"method_params must be a dict, got {type(method_params).__name__}",
            argument="method_params",
        )
    for key in ("target", "additional_forward_args"):
        if key in method_params:
            raise InvalidArgumentError(
                f"method_params must not hold {key!r}: evaluate's own {key} is used",
                argument=f"method_params.{key}",
            )
    return dict(method_params)


# ----------------------------------------------------------------------- captum's metrics


def _generator(seed: int | None, like: Tensor) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=like.device)
    g.manual_seed(seed)
    return g


def _device(g: torch.Generator | None, x: Tensor) -> torch.device:
    return g.device if g is not None else x.device


def _gaussian(g: torch.Generator | None, std: float) -> Callable[[Any], tuple[Any, Any]]:
    def perturb(inputs: Any) -> tuple[Any, Any]:
        xs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
        noise = tuple(
            (torch.randn(x.shape, generator=g, dtype=x.dtype, device=_device(g, x)) * std).to(
                x.device
            )
            for x in xs
        )
        pert = tuple(x - i for x, i in zip(xs, noise, strict=True))
        return (noise[0], pert[0]) if isinstance(inputs, Tensor) else (noise, pert)

    return perturb


def _uniform(g: torch.Generator | None) -> Callable[[Any, float], Any]:
    def perturb(inputs: Any, radius: float) -> Any:
        xs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
        out = tuple(
            x
            + torch.empty(x.shape, dtype=x.dtype, device=_device(g, x))
            .uniform_(-radius, radius, generator=g)
            .to(x.device)
            for x in xs
        )
        return out[0] if isinstance(inputs, Tensor) else out

    return perturb


def _sensitivity(
    model: Any,
    xs: Tensors,
    as_tuple: bool,
    p: dict[str, Any],
    seed: int | None,
    method: str,
    params: dict[str, Any],
    target: Any,
    additional_forward_args: Any,
) -> Tensor:
    from methods.api import attribute  # methods.api imports the registry's methods

    kwargs: dict[str, Any] = {"target": target}
    if additional_forward_args is not None:
        kwargs["additional_forward_args"] = additional_forward_args
    if "baselines" in params:  # per-example baselines are expanded with the perturbed copies
        kwargs["baselines"] = params.pop("baselines")

    def explain(x: Any, **kw: Any) -> Any:
        return attribute(model, x, method, **kw, **params).attributions

    return captum_metrics.sensitivity_max(
        explain,
        restore_form(xs, as_tuple),
        _uniform(_generator(seed, xs[0])),
        perturb_radius=p["perturb_radius"],
        n_perturb_samples=p["n_perturb_samples"],
        norm_ord=p["norm_ord"],
        max_examples_per_batch=p["max_examples_per_batch"],
        **kwargs,
    )
