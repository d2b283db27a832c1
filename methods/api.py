"""``methods.attribute`` and ``methods.available``: the engine's public entry points."""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, cast

import torch

from methods import registry
from methods.engine import layers, layout, superpixels, tiling
from methods.engine import precision as precision_
from methods.engine.background import Background, background_of
from methods.engine.batching import check_batch_size
from methods.engine.call import Call, Output, Result
from methods.engine.guard import is_torchscript, model_guard
from methods.engine.inputs import Forward, check_floating, format_args, format_inputs, restore_form
from methods.engine.outputs import check_scale
from methods.engine.targets import make_target, predicted_regions
from methods.errors import (
    BaselineError,
    InvalidArgumentError,
    InvalidTypeError,
    UnsupportedModelError,
)
from methods.layer import multi
from methods.layer._common import LayerParams, upsampler
from methods.params import parse_params
from methods.progress import shown as show_progress
from methods.registry import MethodInfo

#: True while ``methods.export`` traces an attribution into a program that returns the
#: attributions only: no fidelity is computed then (its delta ratio is Python floats, which
#: a trace over a symbolic batch cannot hold)
EXPORTING: contextvars.ContextVar[bool] = contextvars.ContextVar("exporting", default=False)


def available() -> list[MethodInfo]:
    """Every registered method with its kind, needs, and parameter JSON schema."""
    return [s.info() for s in registry.specs()]


def attribute(
    model: Any,
    inputs: Any,
    method: str,
    /,
    target: Any = None,
    baselines: Any = None,
    additional_forward_args: Any = None,
    internal_batch_size: Any = None,
    perturbations_per_eval: Any = None,
    noise_tunnel: dict[str, Any] | None = None,
    seed: int | None = None,
    return_convergence_delta: bool = False,
    progress: bool = False,
    precision: str | None = None,
    verify: bool = False,
    fidelity_tolerance: float | None = None,
    fidelity_view: Callable[[torch.Tensor], torch.Tensor] | None = None,
    output: str | None = None,
    multi_label: bool = False,
    **params: Any,
) -> Result:
    """Attribute ``model``'s targeted output to ``inputs`` with the registered ``method``.

    Arguments follow Captum's vocabulary and semantics (see the README's Python quickstart);
    method-specific parameters are keyword arguments with Captum's names. ``model``,
    ``inputs`` and ``method`` are positional, so Captum's IG keyword ``method=`` reaches the
    parameter check (which names its spelling here, ``approximation_method``) instead of
    clashing with them. ``progress=True`` shows a tqdm bar on stderr over the model
    evaluations (Captum's ``show_progress``).

    ``precision`` (``"float32"``, ``"bfloat16"``, ``"float16"`` or ``"auto"``; unset: the
    model's own dtype) runs the model's forward and backward in that dtype with the engine's
    sums in float32 (``methods.engine.precision``); the result's ``fidelity`` says what it
    cost, and with ``verify=True`` compares with the float32 answer, which replaces an answer
    whose worst example is more than ``fidelity_tolerance`` (relative L2; default 0.05) away.
    ``fidelity_view`` maps each attribution tensor to what the check compares (default: the
    attributions as returned); the service passes a sum over the embedding dim on token
    models, whose answers are one score per token.

    ``baselines`` may be a background set (``Background(rows, weights)`` or ``{"background":
    rows}``): the answer is then the (weighted) mean of the answers with each row as the
    baseline, computed in one call (``methods.engine.background``); the SHAP family's
    distribution methods take the rows as their distribution. ``target={"top_k": K}``
    attributes each example's K highest-scoring classes, best first: the attributions get a
    dim of K after the examples' and ``result.target`` holds the classes. ``output``
    (``"raw"``, ``"probability"``, ``"log_probability"``, ``"log_odds"``) is the scale
    attributed (``methods.engine.outputs``); ``multi_label=True``: each class is its own
    label, so probabilities are per-label sigmoids, not a softmax over the classes.
    Shapley-family methods report ``base_values``. A segmentation model's class over a region
    is ``target={"class": c, "region": mask}`` (a mask of the output's spatial shape, or one
    per example) or ``{"class": c, "region": "predicted"}`` (the pixels the model predicts as
    ``c``), as Captum's ``agg_segmentation_wrapper``.
    """
    spec = registry.get(method)
    p = parse_params(spec.params, method, params)
    if not callable(model):
        raise InvalidTypeError(
            f"model must be a torch.nn.Module or a callable, got {type(model).__name__}",
            argument="model",
        )
    if spec.needs_hooks and is_torchscript(model):
        raise UnsupportedModelError(
            f"{method} needs to intercept the model's modules and operations during the "
            "forward pass, which TorchScript models do not allow; use a hook-free method "
            "(saliency, input_x_gradient, integrated_gradients, gradient_shap or a perturbation "
            "method), or pass the eager nn.Module",
            argument="method",
        )
    xs, as_tuple = format_inputs(inputs, sparse=spec.sparse_inputs)
    p, drawn = superpixels.resolved(spec.mask_params, p, xs)
    sparse = any(x.shape[0] != xs[0].shape[0] for x in xs)
    scale = check_scale(output)
    if not isinstance(multi_label, bool):
        raise InvalidTypeError(
            f"multi_label must be a bool, got {multi_label!r}", argument="multi_label"
        )
    bg = background_of(baselines)
    if bg is not None and sparse:
        raise BaselineError(
            "a background set tiles every input per row, but some inputs are not per example "
            "(their dim 0 differs from inputs[0]'s); pass one baseline",
            argument="baselines",
        )
    if bg is not None and spec.baseline_distribution:
        if bg.weights is not None:
            raise BaselineError(
                f"{method} draws its baselines from the rows uniformly; pass the background "
                "without weights",
                argument="baselines",
            )
        baselines = bg.rows  # the rows are its distribution
    elif bg is not None:
        baselines = bg  # resolved per call: tiled once per row (_attribute)
    if sparse and noise_tunnel is not None:
        raise InvalidArgumentError(
            "noise_tunnel draws noisy copies of every example, but some inputs are not per "
            "example (their dim 0 differs from inputs[0]'s); attribute without noise_tunnel",
            argument="noise_tunnel",
        )
    if spec.differentiates_inputs:
        check_floating(xs, method)
    if return_convergence_delta and not spec.returns_delta:
        raise InvalidArgumentError(
            f"{method} has no convergence delta; return_convergence_delta must be false",
            argument="return_convergence_delta",
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidTypeError(f"seed must be an int or None, got {seed!r}", argument="seed")
    if not isinstance(progress, bool):
        raise InvalidTypeError(f"progress must be a bool, got {progress!r}", argument="progress")
    prec = precision_.check_precision(precision)
    tolerance = precision_.check_tolerance(fidelity_tolerance)
    if not isinstance(verify, bool):
        raise InvalidTypeError(f"verify must be a bool, got {verify!r}", argument="verify")
    if fidelity_view is not None and not callable(fidelity_view):
        raise InvalidTypeError(
            f"fidelity_view must be a function of a tensor, got {type(fidelity_view).__name__}",
            argument="fidelity_view",
        )
    upsample = upsampler(p, xs)  # layer methods' interpolate_to_input (checks the mode now)
    ppe = check_batch_size(perturbations_per_eval, "perturbations_per_eval")
    if sparse:  # inputs that are not per example go whole into every forward: one each
        ppe = 1
    args = format_args(additional_forward_args)
    call = Call(
        method=method,
        model=model,
        forward=Forward(model, args, output=scale, independent=multi_label),
        inputs=xs,
        target=make_target(target, xs[0].shape[0]),
        baselines=baselines,
        internal_batch_size=check_batch_size(internal_batch_size, "internal_batch_size"),
        perturbations_per_eval=ppe,
        generator=_generator(seed, xs[0].device),
        return_delta=bool(return_convergence_delta),
    )
    given = {**params, **{k: v for k, v in {
        "baselines": baselines, "internal_batch_size": internal_batch_size,
        "perturbations_per_eval": perturbations_per_eval, "noise_tunnel": noise_tunnel,
        "seed": seed, "output": output, "multi_label": multi_label or None,
    }.items() if v is not None}}  # fmt: skip
    own = precision_.model_dtype(model)
    if prec is None or (prec != "auto" and precision_.DTYPES[prec] == own and not verify):
        # with its delta where the method has one (two forwards): the fidelity reports it
        # per example (a noise tunnel's is per sample: no ratio to report)
        delta = bool(return_convergence_delta) or (
            spec.returns_delta and noise_tunnel is None and not EXPORTING.get()
        )
        with show_progress(progress, method):
            result = _attribute(
                spec, call.replace(return_delta=delta), p, noise_tunnel, as_tuple, upsample, seed
            )
        # every answer says its precision (the model's own here: nothing to check)
        own_name = str(own).removeprefix("torch.")
        fidelity = precision_.Fidelity(own_name, _delta_ratio(result))
        if not return_convergence_delta:
            result = dataclasses.replace(result, convergence_delta=None)
        return dataclasses.replace(
            result, fidelity=fidelity, given=given, segments=_segments(result, drawn)
        )
    if seed is None and (spec.stochastic or noise_tunnel is not None):
        seed = int(torch.randint(0, 2**31 - 1, ()))  # the same samples in every precision

    def run_in(name: str) -> Result:
        """The attribution with the model in ``name``, with its delta where it has one."""
        dtype = precision_.DTYPES[name]
        m = model if dtype == own else precision_.twin(model, dtype)
        fn = m if dtype == own else precision_.Cast(m, dtype)
        in_call = call.replace(
            model=m,
            forward=Forward(fn, args, output=scale, independent=multi_label),
            generator=_generator(seed, xs[0].device),
            return_delta=spec.returns_delta,
        )
        return _attribute(spec, in_call, p, noise_tunnel, as_tuple, upsample, seed)

    with show_progress(progress, method):
        key = (spec.name, tuple((x.dim(), x.dtype, x.device) for x in xs))
        result = in_precision(
            model, key, xs[0].device, prec, run_in, verify, tolerance, fidelity_view
        )
    if not return_convergence_delta:
        result = dataclasses.replace(result, convergence_delta=None)
    return dataclasses.replace(result, given=given, segments=_segments(result, drawn))


def _segments(result: Result, drawn: Any) -> Any:
    """The regions a result reports: the method's own (XRAI's), else the superpixels drawn."""
    return result.segments if result.segments is not None else drawn


def in_precision(
    model: Any,
    key: Hashable,
    device: torch.device,
    prec: str,
    run_in: Callable[[str], Any],
    verify: bool,
    tolerance: float,
    view: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> Any:
    """``run_in`` in ``prec`` (``auto``: the precision the model's probe for ``key`` kept,
    probed on this call if none was), with what the precision cost; verified against float32
    when asked, and replaced by it when out of tolerance. ``run_in`` gives a dataclass
    with ``attributions``, ``convergence_delta`` and ``fidelity`` (``Result``,
    ``GenerationResult``)."""
    chosen = None
    if prec == "auto":
        known = precision_.known_probe(model, key)
        if known is None:  # the first call of its kind: measure every precision on it
            found, answers = precision_.probe(model, key, device, run_in, tolerance)
            result, ref = answers[found.precision], answers["float32"]
            rel, agree, k = precision_.compare(result.attributions, ref.attributions, view)
            fid = precision_.Fidelity(
                found.precision, _delta_ratio(result), checked=True, rel_l2=rel,
                topk_agreement=agree, top_k=k, tolerance=tolerance, chosen=found.reason(),
            )  # fmt: skip
            return dataclasses.replace(result, fidelity=fid)
        prec, chosen = known.precision, known.reason()
    result = run_in(prec)
    fid = precision_.Fidelity(prec, _delta_ratio(result), tolerance=tolerance, chosen=chosen)
    if verify:
        ref = run_in("float32")
        rel, agree, k = precision_.compare(result.attributions, ref.attributions, view)
        fid = dataclasses.replace(fid, rel_l2=rel, topk_agreement=agree, top_k=k, checked=True)
        if not fid.ok:  # the float32 answer, saying what was tried
            fid = dataclasses.replace(
                fid, precision="float32", tried=prec, fallback=True, delta_ratio=_delta_ratio(ref)
            )
            result = ref
    return dataclasses.replace(result, fidelity=fid)


def _delta_ratio(result: Any) -> list[float] | None:
    """Per example, |delta| over the output gap, the gap read back from the attributions'
    sums."""
    delta = result.convergence_delta
    if delta is None:
        return None
    attrs = result.attributions
    if isinstance(delta, list):  # several layers: the first one's
        delta, attrs = delta[0], attrs[0]
    tensors = precision_.flat(attrs)
    lead = tuple(delta.shape)  # (N,), or (N, K) for a top_k target
    if not tensors or any(tuple(t.shape[: len(lead)]) != lead for t in tensors):
        return None  # a delta per sample (gradient_shap, noise tunnels): no gap to read back
    rows, delta = delta.numel(), delta.reshape(-1)
    total = sum(t.detach().double().reshape(rows, -1).sum(1) for t in tensors)
    return precision_.delta_ratio(delta, total - delta.detach().double())


def _attribute(
    spec: registry.MethodSpec,
    call: Call,
    p: Any,
    noise_tunnel: dict[str, Any] | None,
    as_tuple: bool,
    upsample: Any,
    seed: int | None,
) -> Result:
    """The method on ``call``: a ``top_k`` target resolved to the K best classes and a
    background set to its rows (``methods.engine.tiling``), then ``_attributed``; with the
    base values of a Shapley-family method that did not report them."""

    def again(tiled: Call) -> Result:
        return _attribute(spec, tiled, p, noise_tunnel, as_tuple, upsample, seed)

    if call.target.form == "top_k":
        return tiling.top_k(call, again, distribution=spec.baseline_distribution)
    if (
        call.target.form == "region" and call.target.index
    ):  # fixed once from the unperturbed output: the pixels predicted, or the mask per example
        with torch.no_grad(), model_guard(call.model):
            out = call.forward(call.inputs)
        return again(call.replace(target=predicted_regions(call.target, out)))
    if isinstance(call.baselines, Background) and not spec.own_background:
        return tiling.over_background(call, again)
    result = _attributed(spec, call, p, noise_tunnel, as_tuple, upsample, seed)
    if spec.base_values and result.base_values is None:
        result = dataclasses.replace(result, base_values=tiling.base_values(call))
    return result


def _attributed(
    spec: registry.MethodSpec,
    call: Call,
    p: Any,
    noise_tunnel: dict[str, Any] | None,
    as_tuple: bool,
    upsample: Any,
    seed: int | None,
    laid_out: bool = False,
) -> Result:
    """The method on ``call``: once, or for a list of layers once per layer or in one pass;
    image batches fed channels-last where ``layout`` says it pays (``laid_out``: decided)."""
    gradients = not spec.forward_only

    if (
        not laid_out
        and not EXPORTING.get()
        and layout.suits(call.model, call.inputs, spec.name, gradients)
    ):
        return layout.tried(
            call,
            spec.name,
            lambda c: _attributed(spec, c, p, noise_tunnel, as_tuple, upsample, seed, True),
            again=lambda: call.replace(generator=_generator(seed, call.inputs[0].device)),
            gradients=gradients,
        )
    paths = p.layer if isinstance(p, LayerParams) and isinstance(p.layer, list) else None
    if paths is None:
        return _run(spec, call, p, noise_tunnel, as_tuple, upsample)
    p = cast(LayerParams, p)
    model, xs = call.model, call.inputs
    side = p.attribute_to_layer_input
    one_pass = multi.ONE_PASS.get(spec.name)
    if one_pass is not None and noise_tunnel is None and upsample is None:
        with model_guard(model), layers.recording() as nested:
            outs = one_pass(call, p, paths)
        results = [
            _result(spec, call, p.model_copy(update={"layer": path}), out, as_tuple, None,
                    nested.get((path, side)) if out.as_tuple is not None else None)
            for path, out in zip(paths, outs, strict=True)
        ]  # fmt: skip
    else:  # one run per layer, each with the seed afresh: what that layer alone gives
        results = []
        for path in paths:
            one = p.model_copy(update={"layer": path})
            fresh = call.replace(generator=_generator(seed, xs[0].device))
            results.append(_run(spec, fresh, one, noise_tunnel, as_tuple, upsampler(one, xs)))
    first = results[0]
    return Result(
        attributions=[r.attributions for r in results],
        convergence_delta=(
            [r.convergence_delta for r in results] if call.return_delta else None  # type: ignore[misc]
        ),
        outputs=first.outputs,
        params={**first.params, "layer": list(paths)},
        method=first.method,
    )


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _run(
    spec: registry.MethodSpec,
    call: Call,
    p: Any,
    noise_tunnel: dict[str, Any] | None,
    as_tuple: bool,
    upsample: Any,
) -> Result:
    """One run of the method on ``call``, shaped as the caller's inputs (or the layer)."""
    layered = isinstance(p, LayerParams)  # only layer methods re-nest their values
    recording: AbstractContextManager[dict[Any, Any]] = (
        layers.recording() if layered else nullcontext({})
    )
    with model_guard(call.model), recording as nested:
        if noise_tunnel is not None:
            from methods.noise_tunnel import run_noise_tunnel

            out, nt_echo = run_noise_tunnel(spec, call, p, noise_tunnel)
        else:
            out = spec.fn(call, p)
            nt_echo = None
    if upsample is not None:  # after the noise tunnel, as a Captum user interpolates its result
        out = upsample(out)
    # a layer whose value nests tuples (an LSTM's out, (h, c)) gets its attributions re-nested
    nest = None
    if layered and out.as_tuple is not None:
        nest = nested.get((p.layer, p.attribute_to_layer_input))
    return _result(spec, call, p, out, as_tuple, nt_echo, nest)


def _result(
    spec: registry.MethodSpec,
    call: Call,
    p: Any,
    out: Output,
    as_tuple: bool,
    nt_echo: dict[str, Any] | None,
    nest: layers.Nest | None = None,
) -> Result:
    # The frozen params model's fields are model_dump()'s top-level values, without its cost.
    echo: dict[str, Any] = {
        k: v for k, v in vars(p).items() if v is None or isinstance(v, (int, float, str, bool))
    }
    if spec.batching == "internal_batch_size":
        echo["internal_batch_size"] = call.internal_batch_size
    elif spec.batching == "perturbations_per_eval":
        echo["perturbations_per_eval"] = call.perturbations_per_eval
    echo.update(out.echo)
    if nt_echo is not None:
        echo["noise_tunnel"] = nt_echo
    form = as_tuple if out.as_tuple is None else out.as_tuple
    # laid out as a caller's tensors are (a layer's value fed channels-last is not)
    attrs = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in out.attributions)
    return Result(
        attributions=restore_form(attrs, form) if nest is None else nest(attrs),
        convergence_delta=out.delta if call.return_delta else None,
        outputs=None if out.outputs is None else out.outputs.contiguous(),
        params=echo,
        method=spec.name,
        base_values=None if out.base is None else out.base.detach().contiguous(),
        standard_error=(
            None
            if out.standard_error is None
            else restore_form(tuple(e.contiguous() for e in out.standard_error), form)
        ),
        segments=out.segments,
    )
