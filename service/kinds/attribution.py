"""How an attributions request becomes ``Attribution`` work on the kinds of model that take
tensors (``tensor`` and ``exported``): one builder (``build_attribution``) and the rules a kind
hands it (``AttributionRules``: the tensor kind's; the exported kind's are the step its file
bakes in). A kind composes its rules; ``AttributionKind`` is the part of ``ModelKind`` both
kinds answer the same way with them."""

from __future__ import annotations

from typing import Any

import numpy as np

from methods.params import MethodParams
from methods.registry import CostShape, MethodSpec
from model_registry import background as model_background
from model_registry.spec import ModelSpec
from model_registry.tasks import task_of
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, WireTarget, new_id
from service.kinds import checks, features, merging, metrics, plan
from service.kinds.base import ModelKind
from service.wire import codec, targets
from service.wire.attributions import AttributionRequest


class AttributionRules:
    """How a kind of model checks an attributions request and shapes its ``Attribution``:
    the tensor kind's rules. A kind with other rules (the exported kind: a step baked into a
    file) subclasses these; both kinds build their work through ``build_attribution``."""

    #: the work an attributions request becomes
    work: type[Attribution] = Attribution
    #: whether its worker groups a text's tokens into ``units`` (``service.kinds.features``)
    units: bool = True

    def plan(self, spec: ModelSpec, method: str, params: dict[str, Any]) -> plan.Plan:
        return plan.plan(spec, method, params)

    def effective(
        self, spec: ModelSpec, ms: MethodSpec, req: AttributionRequest, p: MethodParams
    ) -> MethodParams:
        """The params the work runs with (a kind with fixed params checks them here)."""
        return p

    def precision(self, spec: ModelSpec, req: AttributionRequest) -> str | None:
        """The dtype the model runs in (``checks.precision``)."""
        return checks.precision(spec, req)

    def engine_params(self, p: MethodParams) -> dict[str, Any]:
        return checks.given(p)

    def target(self, spec: ModelSpec, ms: MethodSpec, raw: Any, n: int) -> WireTarget:
        names = task_of(spec).targets
        if raw is None and not ms.needs_target and names != "answer":
            return None
        return targets.resolve(raw, spec.output, n, names)

    def batch_sizes(
        self, settings: Settings, spec: ModelSpec, req: AttributionRequest
    ) -> tuple[int | str | None, int | str | None]:
        ibs = checks.batch_size(
            "internal_batch_size",
            req.internal_batch_size,
            spec.internal_batch_size,
            settings.internal_batch_size,
            settings.max_internal_batch_size,
        )
        ppe = checks.batch_size(
            "perturbations_per_eval",
            req.perturbations_per_eval,
            spec.perturbations_per_eval,
            settings.perturbations_per_eval,
            settings.max_perturbations_per_eval,
        )
        return ibs, ppe


def build_attribution(
    rules: AttributionRules,
    settings: Settings,
    spec: ModelSpec,
    req: AttributionRequest,
    deadline: float,
    request_id: str = "",
) -> Attribution:
    """Every check that needs no model, by the kind's ``rules``: the request as an
    ``Attribution``, or a 4xx ServiceError."""
    planned = rules.plan(spec, req.method, req.params)
    ms = planned.method
    raw = checks.decode_params(ms, planned.params, settings)
    p = rules.effective(spec, ms, req, checks.validate_params(ms, raw))
    checks.check_limits(ms, p, settings)
    precision = rules.precision(spec, req)
    # a share of low-precision answers is checked against float32 unasked (never merged)
    sampled = checks.sampled(settings, spec, precision)
    if req.verify and precision is None and (ms.stochastic or req.noise_tunnel is not None):
        raise InvalidRequest(
            f"{ms.name}{' with a noise tunnel' if req.noise_tunnel else ''} draws random "
            "samples in the working dtype, so a float64 reference would draw different "
            "ones; verify a deterministic method",
            loc=("body", "verify"),
        )
    if planned.attributed_layer is not None and req.noise_tunnel is not None:
        raise UnsupportedMethod(
            "noise_tunnel adds noise to the inputs, which are token ids on this model",
            loc=("body", "noise_tunnel"),
        )
    nt = checks.noise_tunnel(req.noise_tunnel, settings)
    inputs = codec.decode_within(req.inputs, spec, settings)
    if inputs.texts:
        shapes: tuple[tuple[int, ...], ...] = ((checks.check_texts(inputs.texts, settings),),)
    else:
        shapes = tuple(tuple(int(d) for d in a.shape[1:]) for a in inputs.arrays)
    p, drawn = features.draw_superpixels(spec, ms, p, inputs)
    if req.units not in (None, "token") and not rules.units:
        raise InvalidRequest(
            f"model {spec.id!r} attributes its tokens only (units: token)", loc=("body", "units")
        )
    n_units = features.check_units(spec, ms, p, req.units, inputs, req.method)
    # a text's units are its features: a perturbation costs one row per unit
    costed = p if n_units is None else p.model_copy(update={"feature_mask": np.arange(n_units)})
    target = rules.target(spec, ms, req.target, inputs.n)
    task = task_of(spec)
    if req.output not in (None, "raw") and task.targets in ("none", "region"):
        raise InvalidRequest(
            f"output {req.output!r} reads the output as class scores; a {task.name} model's "
            'is not: attribute its raw output ("raw")',
            loc=("body", "output"),
        )
    baselines = codec.decode_baselines(
        req.baselines, spec, inputs, settings.max_tensor_elements, background=True
    )
    if baselines is None and ms.base_values and not inputs.texts:
        default = model_background.of(spec)  # models.toml background: the Shapley default
        if default is not None:
            baselines = {"background": (default[0],), "weights": default[1]}
    n_base, per_row = 1, 1  # a distribution's rows; a background set's, each a whole answer
    if isinstance(baselines, tuple) and baselines and isinstance(baselines[0], np.ndarray):
        n_base = int(baselines[0].shape[0])
    if isinstance(baselines, dict):
        b = int(baselines["background"][0].shape[0])
        if ms.baseline_distribution and baselines["weights"] is not None:
            raise InvalidRequest(
                f"{ms.name} draws its baselines from the rows uniformly; send the background "
                "without weights",
                loc=("body", "baselines", "weights"),
            )
        n_base, per_row = (b, 1) if ms.baseline_distribution else (1, b)
    rows = ms.cost(costed, CostShape(shapes, n_base, req.return_convergence_delta)) * per_row
    if target is not None and target["form"] == "top_k":
        rows *= int(target["k"])  # one answer per class
    if nt is not None:
        rows *= int(nt.get("nt_samples", 5))
    chosen, metric_rows = metrics.plan(
        None if req.metrics is None else req.metrics.asked(),
        ms,
        token_layer=planned.attributed_layer is not None,
        floats=all(a.dtype.kind == "f" for a in inputs.arrays),
        method_rows=rows,
    )
    rows += metric_rows
    est = rows * inputs.n
    checks.check_cost(est, inputs.n, rows, settings, ms, p)
    ibs, ppe = rules.batch_sizes(settings, spec, req)
    work = rules.work(
        id=new_id(),
        model_id=spec.id,
        method=ms.name,
        arrays=inputs.arrays,
        texts=inputs.texts,
        target=target,
        baselines=baselines,
        params=rules.engine_params(p),
        internal_batch_size=ibs,
        perturbations_per_eval=ppe,
        noise_tunnel=nt,
        seed=req.seed,
        return_delta=req.return_convergence_delta,
        deadline=deadline,
        n=inputs.n,
        cost=est,
        requested=req.method,
        attributed_layer=planned.attributed_layer,
        post_abs=planned.post_abs,
        request_id=request_id,
        max_tokens=settings.max_text_tokens,
        verify=req.verify or sampled,
        precision=precision,
        fidelity_tolerance=spec.fidelity_tolerance,
        images=inputs.images,
        metrics=chosen,
        shared_baselines=ms.baseline_distribution or isinstance(baselines, dict),
        output=req.output,
        multi_label=task.independent,
        drawn=drawn,
        units=req.units or "token",
    )
    # the metrics' noise is drawn for the request's batch: never merged, never split
    work.key = None if chosen else merging.key(work, ms, p, spec.texts_batch)
    return work


class AttributionKind(ModelKind):
    """A kind whose attributions requests are checked and built by its ``rules``."""

    rules: AttributionRules

    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> plan.Plan:
        planned = self.rules.plan(spec, method, params)
        if settings is not None:
            ms = planned.method
            checks.validate_params(ms, checks.decode_params(ms, planned.params, settings))
        return planned

    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Attribution:
        return build_attribution(self.rules, settings, spec, req, deadline, request_id)
