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

import methods
from methods import registry
from methods.engine.precision import Fidelity, model_dtype
from methods.errors import AttributionCancelled, AttributionError, ModelError
from methods.generation import chat, targets
from methods.generation.catalog import METHODS, PERTURBATION
from methods.generation.features import encode, make_features
from methods.generation.lm import DEFAULT_GEN_ARGS
from methods.params import MethodParams
from methods.registry import MethodSpec
from model_registry.spec import ExplainSpec, LoadedModel, ModelSpec
from service.core import events
from service.core.errors import InvalidRequest, LimitExceeded, Loc, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Generation, Reply, Work, new_id, runs
from service.kinds import checks, generation_inputs
from service.kinds.base import Catalogue, ModelKind, Ran, envelope
from service.kinds.generation_limits import check_counts, estimate
from service.kinds.plan import Plan
from service.wire.attributions import AttributionRequest
from service.wire.engine_errors import from_engine

#: Captum's default number of generated tokens when the target is null
DEFAULT_NEW_TOKENS: int = DEFAULT_GEN_ARGS["max_new_tokens"]


#: params of every generation method that say what is attributed (``methods.generation.targets``)
TARGET_KEYS = ("target_fn", "contrast_target", "contrast_fn")


def _params(method: str, raw: dict[str, Any]) -> tuple[MethodParams, dict[str, Any], Any]:
    params = dict(raw)
    gen_args = params.pop("gen_args", None)
    for key in (*TARGET_KEYS, "step_scores"):
        params.pop(key, None)
    for name in ("feature_mask", "layer"):
        if name in params:
            raise InvalidRequest(
                f"{name} is set from the prompt's features on causal language models; leave it out",
                loc=("body", "params", name),
            )
    ms = checks.method_spec(method)
    checks.check_param_names(ms, params)
    p = _validated(ms, params)
    given = {k: getattr(p, k) for k in p.model_fields_set if k not in SET_HERE}
    return p, given, gen_args


#: params attribute_generation sets itself (the token embedding; the prompt's features)
SET_HERE = ("layer", "feature_mask")


def _validated(ms: MethodSpec, params: dict[str, Any]) -> MethodParams:
    """The params validated as the engine will see them: a layer method's ``layer`` is the
    model's token embedding, which attribute_generation fills in (a stand-in here)."""
    if "layer" in ms.params.model_fields:
        params = {**params, "layer": "the token embedding"}
    return checks.validate_params(ms, params)


def _gen_args(gen_args: Any, target: Any, settings: Settings) -> tuple[dict[str, Any] | None, int]:
    """Over HTTP only ``max_new_tokens`` (greedy decoding); the tokens the target may have.
    Unset, an answer is generated up to the default length or the server's target limit,
    whichever is less (a server with a lower limit must not refuse every generated answer)."""
    loc = ("body", "params", "gen_args")
    if gen_args is None:
        n = min(DEFAULT_NEW_TOKENS, settings.max_target_tokens)
        if target is None and n < DEFAULT_NEW_TOKENS:
            return {"max_new_tokens": n}, n
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


def _method(spec: ModelSpec, name: str) -> MethodSpec:
    ms = checks.method_spec(name)  # 404 for unknown names
    if ms.name not in METHODS:
        raise UnsupportedMethod(
            f"{name} cannot attribute a causal language model's answer; model "
            f"{spec.id!r} serves {list(METHODS)}",
            loc=("body", "method"),
        )
    return ms


def _build_work(
    settings: Settings, spec: ModelSpec, req: AttributionRequest, deadline: float, request_id: str
) -> Generation:
    """Every check that needs no model: the request as a job, or a 4xx ServiceError."""
    ms = _method(spec, req.method)
    for name, value, default in (
        ("baselines", req.baselines, None),
        ("noise_tunnel", req.noise_tunnel, None),
        ("return_convergence_delta", req.return_convergence_delta, False),
        ("units", req.units, None),
    ):
        if value != default:
            where = {
                "baselines": " (baselines of the prompt's features go in inputs.baselines)",
                "units": " (group the prompt's tokens with inputs.features)",
            }.get(name, "")
            raise InvalidRequest(
                f"{name} does not apply to causal language models" + where,
                loc=("body", name),
            )
    if req.target is not None and not isinstance(req.target, str):
        raise InvalidRequest(
            "target is the answer's text (or null to generate it)", loc=("body", "target")
        )
    g = generation_inputs.parse(req.inputs)
    p, params, gen_args = _params(ms.name, req.params)
    objective = _objective(req.params)
    try:
        shown = targets.check_step_scores(req.params.get("step_scores"))
    except AttributionError as exc:
        raise InvalidRequest(str(exc), loc=("body", "params", "step_scores")) from None
    checks.check_limits(ms, p, settings)
    gen, new_tokens = _gen_args(gen_args, req.target, settings)
    conversation = chat.is_chat(g["prompt"])
    if not conversation and not g["prompt"].strip() and not g["features"]:
        raise InvalidRequest("the prompt is empty", loc=("body", "inputs", "prompt"))
    # words are a lower bound of tokens: refuse what is surely over, before any work
    if conversation:
        contents = [m["content"] for m in g["prompt"]]
        text = " ".join(contents)
        per = {"turns": len(contents), "sentences": sum(len(chat.sentences(c)) for c in contents)}
    else:
        slots = g["features"]
        text = (
            g["prompt"] + " " + " ".join(slots.values() if isinstance(slots, dict) else slots or [])
        )
    words = len(text.split()) + 1
    if conversation:
        n_features = per.get(g["features"], words)
    else:
        n_features = len(g["features"]) if g["features"] is not None else words
    target_words = len(req.target.split()) if req.target is not None else new_tokens
    _check(settings, ms.name, p, n_features, words, max(1, target_words))
    ppe = checks.batch_size(
        "perturbations_per_eval",
        req.perturbations_per_eval,
        spec.perturbations_per_eval,
        None,
        settings.max_perturbations_per_eval,
    )
    ibs = checks.batch_size(
        "internal_batch_size",
        req.internal_batch_size,
        spec.internal_batch_size,
        settings.internal_batch_size,
        settings.max_internal_batch_size,
    )
    precision = _precision(spec, req)
    return Generation(
        id=new_id(),
        model_id=spec.id,
        method=ms.name,
        params=params,
        internal_batch_size=ibs if ms.name in _GRADIENT else None,
        perturbations_per_eval=ppe if ms.name in PERTURBATION else None,
        seed=req.seed,
        deadline=deadline,
        n=1,
        cost=estimate(ms.name, p, n_features, words, max(1, target_words)),
        request_id=request_id,
        max_tokens=settings.max_text_tokens,
        precision=precision,
        # a share of low-precision answers is checked against float32 unasked
        verify=req.verify or checks.sampled(settings, spec, precision),
        fidelity_tolerance=spec.fidelity_tolerance,
        generation={
            **g,
            **objective,
            "step_scores": None if shown is None else list(shown),
            "target": req.target,
            "gen_args": gen,
            "max_target_tokens": settings.max_target_tokens,
            "max_features": settings.max_features,
            "max_cost": settings.max_cost,
        },
    )


_GRADIENT = tuple(m for m in METHODS if m not in PERTURBATION)


def _precision(spec: ModelSpec, req: AttributionRequest) -> str | None:
    """The dtype the model runs in (``checks.precision``). ``verify`` checks a low precision
    against float32, so it needs one."""
    chosen = checks.precision(spec, req)
    if req.verify and chosen is None:
        raise InvalidRequest(
            "verify checks a low-precision answer against float32; on a causal language model "
            f"it needs a precision other than the model's own {spec.dtype} (e.g. "
            '"precision": "bfloat16")',
            loc=("body", "verify"),
        )
    return chosen


def _objective(params: dict[str, Any]) -> dict[str, Any]:
    """``params.target_fn``, ``contrast_target`` and ``contrast_fn``, checked as the engine
    checks them (the contrast's token length is checked in the worker, once tokenized)."""
    out = {
        "target_fn": params.get("target_fn", "log_prob"),
        "contrast_target": params.get("contrast_target"),
        "contrast_fn": params.get("contrast_fn", "log_prob"),
    }
    c = out["contrast_target"]
    if c is not None and (not isinstance(c, str) or not c.strip()):
        raise InvalidRequest(
            "contrast_target is the alternative answer's text",
            loc=("body", "params", "contrast_target"),
        )
    try:
        targets.check(out["target_fn"], c, out["contrast_fn"])
    except AttributionError as exc:
        raise InvalidRequest(
            str(exc), loc=("body", "params", exc.argument or "target_fn")
        ) from None
    return out


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


def _drawn(reply: Reply) -> Reply:
    """The reply as the picture code draws texts: the features as tokens, seq_attr as scores,
    the answer as the target."""
    g = reply.generation or {}
    return Reply(
        work_id=reply.work_id,
        attributions=[np.asarray([g.get("seq_attr", [])], dtype=np.float64)],
        tokens=[list(g.get("input_tokens") or [])],
        target=[repr(g.get("target_text", ""))],
    )


#: where each argument of attribute_generation sits in the request body
_LOC: dict[str, Loc] = {
    "prompt": ("body", "inputs", "prompt"),
    "features": ("body", "inputs", "features"),
    "baselines": ("body", "inputs", "baselines"),
    "skip_tokens": ("body", "inputs", "skip_tokens"),
    "messages": ("body", "inputs", "messages"),
    "target": ("body", "target"),
    "gen_args": ("body", "params", "gen_args"),
    "target_fn": ("body", "params", "target_fn"),
    "contrast_target": ("body", "params", "contrast_target"),
    "contrast_fn": ("body", "params", "contrast_fn"),
    "method": ("body", "method"),
    "perturbations_per_eval": ("body", "perturbations_per_eval"),
    "internal_batch_size": ("body", "internal_batch_size"),
    "seed": ("body", "seed"),
    "precision": ("body", "precision"),
    "verify": ("body", "verify"),
}


@runs(Generation)
def _run(lm: LoadedModel, work: Generation) -> Reply:
    t0 = time.perf_counter()
    g = work.generation or {}
    tokenizer = lm.text_tokenizer
    try:
        _check_tokens(lm, work)
        args = (lm.model, tokenizer, g["prompt"], work.method)
        kw: dict[str, Any] = {
            "target": g["target"],
            "features": g["features"],
            "baselines": g["baselines"],
            "gen_args": g["gen_args"],
            "skip_tokens": g["skip_tokens"],
            "seed": work.seed,
            "perturbations_per_eval": work.perturbations_per_eval,
            "internal_batch_size": work.internal_batch_size,
            "target_fn": g.get("target_fn", "log_prob"),
            "contrast_target": g.get("contrast_target"),
            "contrast_fn": g.get("contrast_fn", "log_prob"),
            "step_scores": g.get("step_scores"),
            "precision": work.precision,
            **work.params,
        }
        if g.get("stream"):
            res = _streamed(methods.stream_generation(*args, **kw))
        else:
            kw.update(verify=work.verify, fidelity_tolerance=work.fidelity_tolerance)
            res = methods.attribute_generation(*args, **kw)
    except (ModelError, AttributionCancelled):
        raise
    except AttributionError as exc:
        raise from_engine(exc, work.request_id, _LOC) from None
    scores = res.output_scores if res.output_scores is not None else res.output_log_probs
    total = scores.sum().reshape(1)
    return Reply(
        work_id=work.id,
        attributions=[res.seq_attr.float().numpy()[None]],
        outputs=total.double().numpy().astype(np.float64),
        params={**res.params, "method": res.method},
        compute_ms=(time.perf_counter() - t0) * 1e3,
        fidelity=(res.fidelity or Fidelity.of(model_dtype(lm.model))).as_dict(),
        generation={
            "input_tokens": res.input_tokens,
            "output_tokens": res.output_tokens,
            "seq_attr": res.seq_attr.tolist(),
            "token_attr": res.token_attr.tolist(),
            "target_text": tokenizer.decode(res.output_ids),
            "target_fn": res.target_fn,
            # every score, log_prob too, unless the request named the ones it wants
            "step_scores": res.step_scores
            if g.get("step_scores") is not None
            else {**res.step_scores, "log_prob": res.output_log_probs.tolist()},
        },
    )


#: the load-time precision probe's prompt and answer length (any tokenizer's words)
PROBE_PROMPT, PROBE_TOKENS = "the old friend said that the city lives near the river", 4


def _probe(lm: LoadedModel) -> Any:
    """``precision = "auto"``'s probe: feature ablation of a short generated answer."""
    return methods.attribute_generation(
        lm.model, lm.text_tokenizer, PROBE_PROMPT, "feature_ablation",
        gen_args={"max_new_tokens": PROBE_TOKENS}, precision="auto",
        fidelity_tolerance=lm.spec.fidelity_tolerance,
    )  # fmt: skip


def _streamed(stream: Any) -> methods.GenerationResult:
    """Each token's row sent as an event as soon as it is known; the whole result."""
    for item in stream:
        if isinstance(item, methods.GenerationStep):
            events.emit({"index": item.index, "token": item.token, "attr": item.attr.tolist()})
        else:
            return item
    raise RuntimeError("the stream ended without its result")


def _check_tokens(lm: LoadedModel, work: Generation) -> None:
    """The exact limits, on tokens: prompt, features, target, cost."""
    g = work.generation or {}
    tokenizer = lm.text_tokenizer
    prompt, features = g["prompt"], g["features"]
    if chat.is_chat(prompt):
        prompt, features = chat.render(tokenizer, prompt, features)
    feats = make_features(tokenizer, prompt, features, g["baselines"], g["skip_tokens"])
    prompt = max(len(feats.prompt_ids()), 1)
    if g["target"] is not None:
        target = len(encode(tokenizer, g["target"], add_special_tokens=False))
    else:
        target = (g["gen_args"] or {}).get("max_new_tokens", DEFAULT_NEW_TOKENS)
    p = _validated(registry.get(work.method), work.params)
    check_counts(
        work.method, p, feats.n, prompt, max(1, target),
        max_features=g["max_features"],
        max_prompt=work.max_tokens or prompt,
        max_target=g["max_target_tokens"],
        max_cost=g["max_cost"],
    )  # fmt: skip


class CausalLMKind(ModelKind):
    """A generative language model with its tokenizer: which part of the prompt made the
    model say this answer (``methods.attribute_generation``)."""

    name = "causal_lm"

    def describe(self, spec: ModelSpec) -> Catalogue:
        return Catalogue(
            methods=list(METHODS),
            explanation=spec.explain or ExplainSpec("feature_ablation"),
            target=None,  # the answer is generated
            tokenizer=True,
            pictures=1,  # the prompt's features
            no_predictions=f"is a causal language model: POST /v1/models/{spec.id}/"
            'attributions with "inputs": {"prompt": "...", "features": [...]} and the answer '
            'as "target" (predictions and tensor inputs are for the other models)',
        )

    def prepare(self, lm: LoadedModel) -> dict[str, Any]:
        """As every kind; with ``precision = "auto"``, the probe of the default method on a
        short prompt, so its first requests do not pay for it (others probe on their first)."""
        info = super().prepare(lm)
        if lm.spec.precision == "auto":
            from service.kinds.prepare import precision_of, probed  # worker side only

            info["precision"] = precision_of(lm, *probed(lm, lambda: _probe(lm)))
        return info

    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> Plan:
        ms = _method(spec, method)
        _params(method, params)
        return Plan(ms, dict(params))

    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Generation:
        return _build_work(settings, spec, req, deadline, request_id)

    def response(
        self,
        spec: ModelSpec,
        work: Work,
        reply: Reply,
        timing: dict[str, float],
        encoding: str = "json",
        requested: str | None = None,
    ) -> dict[str, Any]:
        g = reply.generation or {}
        requested = requested or str(getattr(work, "method", ""))
        method = reply.params.get("method", requested)
        shown = Reply(
            work_id=reply.work_id,
            attributions=[np.asarray([g.get("seq_attr", [])], dtype=np.float64)],
            target=[g.get("target_text")],
            outputs=reply.outputs,
            params={k: v for k, v in reply.params.items() if k != "method"},
            fidelity=reply.fidelity,
        )
        body = envelope((spec.id, spec.version), Ran(method, requested), shown, "json", timing)
        body["attributions"] = [g.get("seq_attr", [])]
        if body["outputs"] is not None:
            body["outputs"] = [float(x) for x in np.asarray(body["outputs"]).reshape(-1)]
        for name in ("input_tokens", "output_tokens", "seq_attr", "token_attr", "step_scores"):
            body[name] = g.get(name)
        return body

    def drawn(self, reply: Reply) -> Reply:
        return _drawn(reply)


class Seq2SeqLMKind(CausalLMKind):
    """An encoder-decoder (T5, BART, Marian): requests as for a causal LM, the prompt its
    source text; ``token_attr`` is answer tokens x source features."""

    name = "seq2seq_lm"
