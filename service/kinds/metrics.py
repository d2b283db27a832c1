"""Explanation metrics on an attributions request (CONTRACT 7.3): the request's ``metrics``
checked and costed with the request (server side, ``plan``), and computed in the worker right
after the attributions, on the same model, inputs, target and baselines (``compute``, through
``methods.evaluate``).

A metric is more rows for the engine, batched: infidelity's ``n_perturb_samples`` perturbed
copies of each example go through one forward (with the unperturbed one), a curve's
``steps + 1`` steps of every example through another, and sensitivity_max re-runs the method
``n_perturb_samples`` times, so it counts the method's own rows that many times in the
request's cost and its limit.

The metrics score attributions of the inputs themselves: layer and neuron methods attribute
elsewhere and are refused. Token models attribute at the embedding layer, one score per token:
the curves apply there (tokens replaced by the tokenizer's baseline tokens), the noise metrics
do not (the inputs are token ids).

Noise is drawn from a generator seeded with the request's ``seed``, 0 when it has none: a
request asked again gets the same numbers (``methods.evaluate`` leaves an unseeded call to
torch's global generator; a service has no such state to offer). A metric's
``max_examples_per_batch`` left unset is the request's ``internal_batch_size`` (rows per
forward), so its memory is bounded as the method's is; Captum draws the noise chunk by chunk,
and so do we, so its numbers are Captum's with that ``max_examples_per_batch``.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from methods import evaluation
from methods.errors import AttributionError
from methods.registry import MethodSpec
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.work import Attribution

#: the seed of a request that names none
DEFAULT_SEED = 0
NOISY = ("infidelity", "sensitivity_max")


def plan(
    metrics: dict[str, Any] | None,
    ms: MethodSpec,
    *,
    token_layer: bool,
    floats: bool,
    method_rows: int,
) -> tuple[dict[str, dict[str, Any]] | None, int]:
    """The metrics asked for, checked with every parameter filled in, and the forward rows
    they add per example (``method_rows``: what the method itself costs per example)."""
    if not metrics:
        return None, 0
    try:
        chosen = evaluation.parse_metrics(metrics, True)
    except AttributionError as exc:
        where = str(exc.argument or "metrics").split(".")
        raise InvalidRequest(str(exc), loc=("body", *where)) from None
    if ms.family in ("layer", "neuron") and not token_layer:
        raise UnsupportedMethod(
            f"metrics score attributions of the inputs; {ms.name} attributes to a "
            f"{'layer' if ms.family == 'layer' else 'neuron'}'s "
            + ("activations" if ms.family == "layer" else "inputs for one neuron")
            + ": ask for metrics with a method of the inputs",
            loc=("body", "metrics"),
        )
    for name in NOISY:
        if name in chosen and (token_layer or not floats):
            what = "token ids" if token_layer else "not floating point"
            raise UnsupportedMethod(
                f"{name} adds noise to the inputs, which are {what} on this model; deletion "
                "and insertion apply",
                loc=("body", "metrics", name),
            )
    rows = 0
    for name, p in chosen.items():
        if name == "infidelity":
            rows += p["n_perturb_samples"] + 1
        elif name == "sensitivity_max":
            rows += p["n_perturb_samples"] * method_rows
        else:
            rows += p["steps"] + 1
    return chosen, rows


def curve_baselines(baselines: Any, n: int) -> Any:
    """The baselines the curves fill removed features with: the method's, one row each; a
    distribution of baselines (gradient SHAP's, of another row count) by its mean row."""

    def one(b: Any) -> Any:
        if isinstance(b, torch.Tensor) and b.dim() >= 1 and b.shape[0] not in (1, n):
            return b.mean(dim=0, keepdim=True)
        return b

    if isinstance(baselines, tuple):
        return tuple(one(b) for b in baselines)
    return one(baselines)


def compute(
    model: Any,
    xs: tuple[torch.Tensor, ...],
    attributions: Any,
    work: Attribution,
    kwargs: dict[str, Any],
    token_layer: bool,
) -> tuple[dict[str, Any], float]:
    """The job's metrics of ``attributions`` (the engine's, or per token on token models), as
    numpy; and the time they took (ms). ``kwargs``: the attribution call's own."""
    t0 = time.perf_counter()
    rows = work.internal_batch_size if isinstance(work.internal_batch_size, int) else None
    metrics = {  # memory bounded as the method's own forwards are
        name: {**p, "max_examples_per_batch": p["max_examples_per_batch"] or rows}
        for name, p in (work.metrics or {}).items()
    }
    n = int(xs[0].shape[0])
    seed = work.seed if work.seed is not None else DEFAULT_SEED
    params = {k: v for k, v in kwargs.items() if k not in ("target", "return_convergence_delta")}
    if token_layer:  # the token ids alone; the other inputs (attention masks) ride along
        inputs: Any = xs[0]
        extra: Any = xs[1:] or None
        params.pop("layer", None)
    else:
        inputs, extra = (xs if len(xs) > 1 else xs[0]), None
    result = evaluation.evaluate(
        model,
        inputs,
        attributions,
        target=kwargs["target"],
        metrics=metrics,
        baselines=curve_baselines(params.get("baselines"), n),
        feature_mask=params.get("feature_mask"),
        seed=seed,
        method=work.method if "sensitivity_max" in metrics else None,
        method_params=params,
        additional_forward_args=extra,
    )
    out = {
        name: {k: _numpy(v) for k, v in value.items()} if isinstance(value, dict) else _numpy(value)
        for name, value in result.items()
    }
    return out, (time.perf_counter() - t0) * 1e3


def _numpy(t: torch.Tensor) -> Any:
    """As float64 numpy: the response writes it as nested lists, NaN as null (orjson)."""
    return t.detach().to("cpu", torch.float64).numpy()
