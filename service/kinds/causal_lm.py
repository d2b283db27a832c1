"""Serving causal language models: which part of the prompt made the model say this answer.

``POST /v1/models/{id}/attributions`` on a model of kind ``causal_lm`` (see the README):
``"inputs": {"prompt": "...", "features": [...] | {...} | null, "baselines": ...,
"skip_tokens": [...]}``, ``"target": "answer text" | null`` (null: generated greedily, up to
``params.gen_args.max_new_tokens``). Checked here without the model (shapes of the fields,
the method, its params, limits on words as a lower bound of tokens); the worker checks the
exact token counts and cost once tokenized (``service.worker.generation``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from methods import registry
from methods.generation.api import METHODS, PERTURBATION
from methods.params import MethodParams
from methods.registry import CostShape
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest, LimitExceeded, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Job, Reply, new_id
from service.serving import support
from service.wire.attributions import AttributionRequest

INPUT_KEYS = ("prompt", "features", "baselines", "skip_tokens")
#: Captum's default number of generated tokens when the target is null
DEFAULT_NEW_TOKENS = 25


def is_causal_lm(spec: ModelSpec) -> bool:
    return spec.kind == "causal_lm"


def served_methods() -> list[str]:
    return list(METHODS)


def estimate(method: str, p: MethodParams, features: int, prompt: int, target: int) -> int:
    """Estimated cost: perturbed prompts (gradient methods: rows) x tokens per prompt."""
    ms = registry.get(method)
    prompts = ms.cost(p, CostShape(((features,),), 1, False))
    if method not in PERTURBATION:
        prompts *= target  # one example per target token
    return prompts * (prompt + target)


def _params(method: str, raw: dict[str, Any]) -> tuple[MethodParams, dict[str, Any], Any]:
    from service.serving.attributions import validate_params

    params = dict(raw)
    gen_args = params.pop("gen_args", None)
    for name in ("feature_mask", "layer"):
        if name in params:
            raise InvalidRequest(
                f"{name} is set from the prompt's features on causal language models; leave it out",
                loc=("body", "params", name),
            )
    ms = support.method_spec(method)
    support.check_param_names(ms, params)
    p = validate_params(ms, params)
    return p, {k: getattr(p, k) for k in p.model_fields_set}, gen_args


def _gen_args(gen_args: Any, target: Any, settings: Settings) -> tuple[dict[str, Any] | None, int]:
    """Over HTTP only ``max_new_tokens`` (greedy decoding); the tokens the target may have."""
    loc = ("body", "params", "gen_args")
    if gen_args is None:
        return None, DEFAULT_NEW_TOKENS
    if target is not None:
        raise InvalidRequest("gen_args apply only when target is null (generated)", loc=loc)
    if not isinstance(gen_args, dict) or set(gen_args) - {"max_new_tokens"}:
        raise InvalidRequest(
            'gen_args takes only {"max_new_tokens": N} here (greedy decoding)', loc=loc
        )
    n = gen_args.get("max_new_tokens", DEFAULT_NEW_TOKENS)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidRequest(f"max_new_tokens must be a positive integer, got {n!r}", loc=loc)
    if n > settings.max_target_tokens:
        raise LimitExceeded(
            f"max_new_tokens {n} is over this server's limit of {settings.max_target_tokens} "
            "target tokens",
            loc=(*loc, "max_new_tokens"),
        )
    return {"max_new_tokens": n}, n


def _inputs(raw: Any) -> dict[str, Any]:
    loc = ("body", "inputs")
    if not isinstance(raw, dict):
        raise InvalidRequest(
            'a causal language model takes "inputs": {"prompt": "...", "features": [...], '
            '"baselines": [...]} (features and baselines optional)',
            loc=loc,
        )
    unknown = sorted(set(raw) - set(INPUT_KEYS))
    if unknown:
        raise InvalidRequest(
            f"unknown key(s) {unknown} in inputs; expected {list(INPUT_KEYS)}",
            loc=(*loc, unknown[0]),
        )
    prompt = raw.get("prompt")
    if not isinstance(prompt, str):
        raise InvalidRequest("inputs.prompt must be a string", loc=(*loc, "prompt"))
    features = raw.get("features")
    if features is not None and not (
        (isinstance(features, list) and all(isinstance(v, str) for v in features))
        or (isinstance(features, dict) and all(isinstance(v, str) for v in features.values()))
    ):
        raise InvalidRequest(
            "inputs.features must be a list of strings (one per {} slot of the prompt), an "
            "object of strings (named {slots}), or null (every prompt token is a feature)",
            loc=(*loc, "features"),
        )
    skip = raw.get("skip_tokens")
    if skip is not None and not (
        isinstance(skip, list)
        and all(isinstance(t, (str, int)) and not isinstance(t, bool) for t in skip)
    ):
        raise InvalidRequest(
            "inputs.skip_tokens must be a list of tokens or token ids", loc=(*loc, "skip_tokens")
        )
    return {k: raw.get(k) for k in INPUT_KEYS}


def build_job(
    settings: Settings, spec: ModelSpec, req: AttributionRequest, deadline: float, request_id: str
) -> Job:
    """Every check that needs no model: the request as a job, or a 4xx ServiceError."""
    ms = support.method_spec(req.method)  # 404 for unknown names
    if ms.name not in METHODS:
        raise UnsupportedMethod(
            f"{req.method} cannot attribute a causal language model's answer; model "
            f"{spec.id!r} serves {list(METHODS)}",
            loc=("body", "method"),
        )
    for name, value, default in (
        ("baselines", req.baselines, None),
        ("noise_tunnel", req.noise_tunnel, None),
        ("return_convergence_delta", req.return_convergence_delta, False),
    ):
        if value != default:
            where = " (baselines of the prompt's features go in inputs.baselines)"
            raise InvalidRequest(
                f"{name} does not apply to causal language models"
                + (where if name == "baselines" else ""),
                loc=("body", name),
            )
    if req.target is not None and not isinstance(req.target, str):
        raise InvalidRequest(
            "target is the answer's text (or null to generate it)", loc=("body", "target")
        )
    g = _inputs(req.inputs)
    p, params, gen_args = _params(ms.name, req.params)
    from service.serving.attributions import _batch_size, check_limits

    check_limits(ms, p, settings)
    gen, new_tokens = _gen_args(gen_args, req.target, settings)
    if not g["prompt"].strip() and not g["features"]:
        raise InvalidRequest("the prompt is empty", loc=("body", "inputs", "prompt"))
    # words are a lower bound of tokens: refuse what is surely over, before any work
    text = (
        g["prompt"]
        + " "
        + " ".join(
            (g["features"] or {}).values()
            if isinstance(g["features"], dict)
            else g["features"] or []
        )
    )
    words = len(text.split()) + 1
    n_features = len(g["features"]) if g["features"] is not None else words
    target_words = len(req.target.split()) if req.target is not None else new_tokens
    _check(settings, ms.name, p, n_features, words, max(1, target_words))
    ppe = _batch_size(
        "perturbations_per_eval",
        req.perturbations_per_eval,
        spec.perturbations_per_eval,
        None,
        settings.max_perturbations_per_eval,
    )
    ibs = _batch_size(
        "internal_batch_size",
        req.internal_batch_size,
        spec.internal_batch_size,
        settings.internal_batch_size,
        settings.max_internal_batch_size,
    )
    return Job(
        id=new_id(),
        model_id=spec.id,
        method=ms.name,
        arrays=(),
        texts=(),
        target=None,
        baselines=None,
        params=params,
        internal_batch_size=ibs if ms.name in _GRADIENT else None,
        perturbations_per_eval=ppe if ms.name in PERTURBATION else None,
        noise_tunnel=None,
        seed=req.seed,
        return_delta=False,
        deadline=deadline,
        n=1,
        cost=estimate(ms.name, p, n_features, words, max(1, target_words)),
        request_id=request_id,
        max_tokens=settings.max_text_tokens,
        generation={
            **g,
            "target": req.target,
            "gen_args": gen,
            "max_target_tokens": settings.max_target_tokens,
            "max_features": settings.max_features,
            "max_cost": settings.max_cost,
        },
    )


_GRADIENT = tuple(m for m in METHODS if m not in PERTURBATION)


def _check(
    settings: Settings, method: str, p: MethodParams, features: int, prompt: int, target: int
) -> None:
    check_counts(
        method, p, features, prompt, target,
        max_features=settings.max_features,
        max_prompt=settings.max_text_tokens,
        max_target=settings.max_target_tokens,
        max_cost=settings.max_cost,
        unit="words",
    )  # fmt: skip


def check_counts(
    method: str,
    p: MethodParams,
    features: int,
    prompt: int,
    target: int,
    *,
    max_features: int,
    max_prompt: int,
    max_target: int,
    max_cost: int,
    unit: str = "tokens",
) -> None:
    """The codec's limits on a generation request (server: on words; worker: on tokens)."""
    if prompt > max_prompt:
        raise LimitExceeded(
            f"the prompt has {prompt} {unit}; this server takes at most {max_prompt} tokens",
            loc=("body", "inputs", "prompt"),
        )
    if features > max_features:
        raise LimitExceeded(
            f"the prompt has {features} features; this server attributes to at most "
            f"{max_features} (group tokens into template slots)",
            loc=("body", "inputs", "features"),
        )
    if target > max_target:
        raise LimitExceeded(
            f"the target has {target} {unit}; this server takes at most {max_target} tokens",
            loc=("body", "target"),
        )
    cost = estimate(method, p, features, prompt, target)
    if cost > max_cost:
        raise LimitExceeded(
            f"this request would cost about {cost} token evaluations (perturbed prompts x "
            f"tokens); the limit is {max_cost}: use fewer features, samples or steps, or a "
            "shorter prompt or target",
            loc=("body",),
        )


def for_render(reply: Reply) -> Reply:
    """The reply as the picture code draws texts: the features as tokens, seq_attr as scores,
    the answer as the target."""
    g = reply.generation or {}
    return Reply(
        job_id=reply.job_id,
        attributions=[np.asarray([g.get("seq_attr", [])], dtype=np.float64)],
        tokens=[list(g.get("input_tokens") or [])],
        target=[repr(g.get("target_text", ""))],
    )


def response(
    spec: ModelSpec,
    req: AttributionRequest,
    job: Job,
    reply: Reply,
    queue_ms: float,
    started: float,
) -> dict[str, Any]:
    g = reply.generation or {}
    body: dict[str, Any] = {
        "model_id": spec.id,
        "model_version": spec.version,
        "method": reply.params.get("method", job.method),
        "attributions": [g.get("seq_attr", [])],
        "convergence_delta": None,
        "target": [g.get("target_text")],
        "outputs": None if reply.outputs is None else [float(x) for x in reply.outputs.reshape(-1)],
        "params": {k: v for k, v in reply.params.items() if k != "method"},
        "input_tokens": g.get("input_tokens"),
        "output_tokens": g.get("output_tokens"),
        "seq_attr": g.get("seq_attr"),
        "token_attr": g.get("token_attr"),
        "merged_requests": 1,
        "timing_ms": {
            "queue": round(queue_ms, 3),
            "compute": round(reply.compute_ms, 3),
            "total": round((time.perf_counter() - started) * 1e3, 3),
        },
    }
    if body["method"] != req.method:
        body["requested_method"] = req.method
    return body
