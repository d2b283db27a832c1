"""Tensor models: tensors (or raw texts, through the model's tokenizer) in, one tensor out;
every registered method, gradient methods on token models through their embedding layer.

Request -> work: the codec decodes the inputs and baselines, the method's params are checked
and costed, the target is resolved against the output. Worker: ``methods.attribute`` on the
model (compiled where the method allows; ``methods.verify`` against the float64 CPU copy when
asked), or one forward for predictions. Jobs whose engine calls are separable per example merge
(``service.worker.merge``).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import torch

import methods
from methods import registry
from methods.cancel import checkpoint
from methods.engine.outputs import scaled
from methods.verify import verify
from model_registry.hf_text import text_hierarchy
from model_registry.spec import ExplainSpec, LoadedModel, ModelSpec
from model_registry.tasks import task_of
from service.core.settings import Settings
from service.core.work import Attribution, Prediction, Reply, new_id, runs
from service.kinds import checks, features, merging, metrics, plan, prepare, tensors
from service.kinds.attribution import AttributionKind, AttributionRules
from service.kinds.base import Catalogue, predicted_target
from service.kinds.runtime import disable_compiled, reference, serving_model, worth_eager_retry
from service.wire import codec, targets
from service.wire import regions as wire_regions


class TensorKind(AttributionKind):
    name = "tensor"
    rules = AttributionRules()

    def describe(self, spec: ModelSpec) -> Catalogue:
        return Catalogue(
            methods=plan.served(spec),
            explanation=_explanation(spec),
            # a segmentation model: each example's dominant class (service.wire.regions)
            target=None if task_of(spec).targets == "region" else predicted_target(spec),
            tokenizer=spec.takes_text,
            pictures=max(1, len(spec.inputs)),
        )

    # -- request -> work ----------------------------------------------------------------------
    def predict_work(
        self, settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str
    ) -> Prediction:
        decoded = codec.decode_within(inputs, spec, settings)
        if decoded.texts:
            checks.check_texts(decoded.texts, settings)
        work = Prediction(
            id=new_id(),
            model_id=spec.id,
            n=decoded.n,
            cost=decoded.n,
            arrays=decoded.arrays,
            texts=decoded.texts,
            deadline=deadline,
            max_tokens=settings.max_text_tokens,
            request_id=request_id,
        )
        work.key = merging.predict_key(work)
        return work

    # -- worker side --------------------------------------------------------------------------
    def prepare(self, lm: LoadedModel) -> dict[str, Any]:
        return prepare.prepare(lm)


def _explanation(spec: ModelSpec) -> ExplainSpec:
    """models.toml ``explain``, else integrated gradients where the inputs are differentiable
    (token models: on the embedding layer, as requests are rewritten), feature ablation where
    they are not."""
    if spec.explain is not None:
        return spec.explain
    floats = all(i.dtype.startswith(("float", "bfloat")) for i in spec.inputs)
    if plan.differentiable(spec) and (floats or plan.token_model(spec)):
        return ExplainSpec("integrated_gradients")
    return ExplainSpec("feature_ablation")


@runs(Prediction)
def predict(lm: LoadedModel, work: Prediction) -> Reply:
    """The model's outputs for the job's inputs (one forward, no gradients)."""
    t0 = time.perf_counter()
    xs, tokens = tensors.inputs(lm, work)
    checkpoint()
    out = tensors.forward(lm, xs)
    return Reply(
        work_id=work.id,
        predictions=tensors.numpy(out),
        tokens=tokens,
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


def _attribute(
    lm: LoadedModel, model: Any, inputs: Any, work: Attribution, kwargs: dict[str, Any]
) -> Any:
    """``methods.attribute`` (``methods.verify`` against the float64 CPU copy when the job
    asks): the result and the figures (None without verify). In a low precision the engine
    verifies against float32 itself (the result's fidelity)."""
    if work.precision is not None:
        kwargs = {**kwargs, "precision": work.precision, "verify": work.verify,
                  "fidelity_tolerance": work.fidelity_tolerance}  # fmt: skip
        if work.attributed_layer is not None:  # compared as answered: one score per token
            kwargs["fidelity_view"] = functools.partial(per_token, post_abs=work.post_abs)
        return methods.attribute(model, inputs, work.method, **kwargs), None
    if work.verify:
        return verify(model, inputs, work.method, reference=reference(lm), **kwargs)
    return methods.attribute(model, inputs, work.method, **kwargs), None


def _text_hierarchies(lm: LoadedModel, work: Attribution) -> dict[str, Any]:
    """A hierarchical method's default over texts (``partition``): each text's token tree as
    shap's ``Text`` masker builds it from the model's tokenizer, expanded 5 coalitions a
    round as that masker's batch size (none where the tokenizer cannot say its tokens'
    text)."""
    if not registry.get(work.method).hierarchical:
        return {}
    tokenizer = getattr(lm.tokenizer, "tokenizer", None) or lm.text_tokenizer
    try:
        trees = [text_hierarchy(tokenizer, t).tolist() for t in work.texts]
    except (AttributeError, TypeError, ValueError, KeyError):
        return {}
    return {"clustering": trees, **({} if "batch_size" in work.params else {"batch_size": 5})}


def per_token(attributions: torch.Tensor, post_abs: bool) -> torch.Tensor:
    """A token model's answer: the embedding layer's attributions summed over its last dim
    (of their absolute values where the method's answer is one)."""
    return (attributions.abs() if post_abs else attributions).sum(dim=-1)


@runs(Attribution)
def attribute(lm: LoadedModel, work: Attribution) -> Reply:
    t0 = time.perf_counter()
    device = lm.device
    xs, tokens = tensors.inputs(lm, work)
    n = int(xs[0].shape[0])
    out: torch.Tensor | None = None
    wire = work.target
    if work.predictions or targets.predicted(wire):
        out = tensors.forward(lm, xs)
    if targets.predicted(wire) and out is not None:
        wire = targets.of_predictions(out)
    if wire is not None and wire["form"] == "region" and None in wire["rows"]:
        out = out if out is not None else tensors.forward(lm, xs)
        wire = wire_regions.dominant(wire, out)
    target = targets.to_engine(wire)
    params = {k: tensors.convert(v, device) for k, v in work.params.items()}
    if work.attributed_layer is not None:
        params["layer"] = work.attributed_layer
    firsts, units = None, None
    if work.units != "token":  # a text's words, sentences or paragraphs are its features
        params["feature_mask"], units, firsts = features.unit_mask(
            lm.tokenizer, work.texts, xs[0], work.units
        )
    elif work.texts and "clustering" not in params:
        params.update(_text_hierarchies(lm, work))
    baselines: Any = work.baselines
    if isinstance(baselines, dict):  # a background set: the answer averaged over its rows
        weights = baselines["weights"]
        baselines = methods.Background(
            tensors.convert(baselines["background"], device),
            None if weights is None else torch.as_tensor(weights),
        )
    else:
        baselines = tensors.convert(baselines, device)
    # token models whose tokenizer says how: special tokens and padding kept, the pad token
    # elsewhere (not for a distribution of baselines, which mixes the examples' rows)
    default = getattr(lm.tokenizer, "baseline", None)
    masked = getattr(lm.tokenizer, "masked", None)
    if baselines is None and default is not None and not work.shared_baselines:
        # partition hides tokens as shap's Text masker does: with the tokenizer's mask token
        hierarchical = registry.get(work.method).hierarchical
        baselines = masked(xs[0]) if hierarchical and masked is not None else None
        if baselines is None:  # the pad token (a tokenizer without a mask token too)
            baselines = default(xs[0])
    kwargs: dict[str, Any] = {
        "target": target,
        "baselines": baselines,
        "internal_batch_size": work.internal_batch_size,
        "perturbations_per_eval": work.perturbations_per_eval,
        "noise_tunnel": work.noise_tunnel,
        "seed": work.seed,
        "return_convergence_delta": work.return_delta,
        "output": work.output,
        "multi_label": work.multi_label,
        **params,
    }
    inputs = xs if len(xs) > 1 else xs[0]
    # a low precision casts a copy of the eager module (a compiled one is not copied)
    model = lm.model if work.precision is not None else serving_model(lm, registry.get(work.method))
    try:
        res, verification = _attribute(lm, model, inputs, work, kwargs)
    except Exception as exc:  # a compiled graph that fails on new shapes: eager from now on
        if model is lm.model or not worth_eager_retry(exc):
            raise
        res, verification = _attribute(lm, lm.model, inputs, work, kwargs)
        disable_compiled(lm, exc, "on a request")  # eager succeeded: the compiled graph failed
    attrs = res.attributions
    parts = tensors.flat(attrs)  # a nested layer output (an LSTM's out, (h, c)): depth first
    per_layer = [len(tensors.flat(a)) for a in attrs] if isinstance(attrs, list) else None
    delta = res.convergence_delta
    if isinstance(delta, list):  # one per layer: (N, layers)
        delta = torch.stack(delta, dim=1)
    if work.attributed_layer is not None:  # one score per token: sum over the embedding dim
        parts = [per_token(p, work.post_abs) for p in parts]
    scores, metrics_ms = None, 0.0
    if work.metrics:  # the token models' scores are per token, as the inputs' ids
        scored = parts[0] if work.attributed_layer is not None else attrs
        token_layer = work.attributed_layer is not None
        scores, metrics_ms = metrics.compute(model, xs, scored, work, kwargs, token_layer)
    regions = None
    if isinstance(target, dict) and "region" in target:  # what pictures outline
        out = out if out is not None else tensors.forward(lm, xs)
        regions = wire_regions.masks(out, target)
    if res.target is not None:  # top_k: (N, K), each example's classes best first
        if res.outputs is not None and res.outputs.shape == res.target.shape:
            selected = res.outputs
        else:
            whole = out if out is not None else tensors.forward(lm, xs)
            on_scale = scaled(whole, work.output, work.multi_label)  # type: ignore[arg-type]
            selected = on_scale.gather(1, res.target.to(whole.device))
    elif res.outputs is not None and res.outputs.numel() == n:
        selected = res.outputs.reshape(n)
    else:
        whole = out if out is not None else tensors.forward(lm, xs)
        selected = targets.select(scaled(whole, work.output, work.multi_label), target, n)  # type: ignore[arg-type]
    answers = [tensors.numpy(p) for p in parts]
    errors = (
        None
        if res.standard_error is None
        else [tensors.numpy(e) for e in tensors.flat(res.standard_error)]
    )
    if firsts is not None and units is not None:  # one value per unit; the units for tokens
        per_feature = work.params.get("return_input_shape") is False
        answers = [features.per_unit(a, firsts, per_feature) for a in answers]
        errors = (
            None if errors is None else [features.per_unit(e, firsts, per_feature) for e in errors]
        )
        tokens = [[u["text"] for u in row] for row in units]
    return Reply(
        work_id=work.id,
        regions=regions,
        segments=None if res.segments is None else [tensors.numpy(res.segments)],
        units=units,
        attributions=answers,
        as_tuple=isinstance(attrs, tuple),
        layers=per_layer,
        delta=None if delta is None else tensors.numpy(delta),
        outputs=tensors.numpy(selected),
        base_values=None if res.base_values is None else tensors.numpy(res.base_values),
        standard_error=errors,
        target=targets.rows(wire, n) if res.target is None else res.target.tolist(),
        tokens=tokens,
        params=res.params,
        predictions=None if not work.predictions or out is None else tensors.numpy(out),
        compute_ms=(time.perf_counter() - t0) * 1e3,
        verification=None if verification is None else verification.as_dict(),
        fidelity=None if res.fidelity is None else res.fidelity.as_dict(),
        metrics=scores,
        metrics_ms=metrics_ms,
    )
