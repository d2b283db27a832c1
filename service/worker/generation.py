"""A causal LM job in the worker: tokenize, check the exact limits, ``attribute_generation``."""

from __future__ import annotations

import time

import numpy as np

import methods
from methods import registry
from methods.errors import AttributionCancelled, AttributionError, ModelError
from methods.generation.features import encode, make_features
from methods.params import parse_params
from model_registry.spec import LoadedModel
from service.core.errors import AttributionFailed, Loc
from service.core.work import Job, Reply
from service.kinds.causal_lm import DEFAULT_NEW_TOKENS, check_counts

#: where each argument of attribute_generation sits in the request body
_LOC: dict[str, Loc] = {
    "prompt": ("body", "inputs", "prompt"),
    "features": ("body", "inputs", "features"),
    "baselines": ("body", "inputs", "baselines"),
    "skip_tokens": ("body", "inputs", "skip_tokens"),
    "target": ("body", "target"),
    "gen_args": ("body", "params", "gen_args"),
    "method": ("body", "method"),
    "perturbations_per_eval": ("body", "perturbations_per_eval"),
    "internal_batch_size": ("body", "internal_batch_size"),
    "seed": ("body", "seed"),
}


def run_generation(lm: LoadedModel, job: Job) -> Reply:
    t0 = time.perf_counter()
    g = job.generation or {}
    tokenizer = lm.extra["lm_tokenizer"]
    try:
        _check(lm, job)
        res = methods.attribute_generation(
            lm.model,
            tokenizer,
            g["prompt"],
            job.method,
            target=g["target"],
            features=g["features"],
            baselines=g["baselines"],
            gen_args=g["gen_args"],
            skip_tokens=g["skip_tokens"],
            seed=job.seed,
            perturbations_per_eval=job.perturbations_per_eval,
            internal_batch_size=job.internal_batch_size,
            **job.params,
        )
    except (ModelError, AttributionCancelled):
        raise
    except AttributionError as exc:
        loc = _LOC.get(exc.argument or "", ("body", "params", exc.argument or ""))
        raise AttributionFailed(str(exc), loc=loc if exc.argument else ("body",)) from None
    total = res.output_log_probs.sum().reshape(1)
    return Reply(
        job_id=job.id,
        attributions=[res.seq_attr.float().numpy()[None]],
        outputs=total.double().numpy().astype(np.float64),
        params={**res.params, "method": res.method},
        compute_ms=(time.perf_counter() - t0) * 1e3,
        generation={
            "input_tokens": res.input_tokens,
            "output_tokens": res.output_tokens,
            "seq_attr": res.seq_attr.tolist(),
            "token_attr": res.token_attr.tolist(),
            "target_text": tokenizer.decode(res.output_ids),
        },
    )


def _check(lm: LoadedModel, job: Job) -> None:
    """The exact limits, on tokens: prompt, features, target, cost."""
    g = job.generation or {}
    tokenizer = lm.extra["lm_tokenizer"]
    feats = make_features(tokenizer, g["prompt"], g["features"], g["baselines"], g["skip_tokens"])
    prompt = max(len(feats.prompt_ids()), 1)
    if g["target"] is not None:
        target = len(encode(tokenizer, g["target"], add_special_tokens=False))
    else:
        target = (g["gen_args"] or {}).get("max_new_tokens", DEFAULT_NEW_TOKENS)
    p = parse_params(registry.get(job.method).params, job.method, job.params)
    check_counts(
        job.method, p, feats.n, prompt, max(1, target),
        max_features=g["max_features"],
        max_prompt=job.max_tokens or prompt,
        max_target=g["max_target_tokens"],
        max_cost=g["max_cost"],
    )  # fmt: skip
