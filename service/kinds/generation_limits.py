"""The limits of a generation request, on words in the server (a lower bound of tokens) and on
tokens in the worker: features, prompt, target and estimated cost."""

from __future__ import annotations

from methods import registry
from methods.generation.catalog import PERTURBATION
from methods.params import MethodParams
from methods.registry import CostShape
from service.core.errors import LimitExceeded


def estimate(method: str, p: MethodParams, features: int, prompt: int, target: int) -> int:
    """Estimated cost: perturbed prompts (gradient methods: rows) x tokens per prompt."""
    ms = registry.get(method)
    prompts = ms.cost(p, CostShape(((features,),), 1, False))
    if method not in PERTURBATION:
        prompts *= target  # one example per target token
    return prompts * (prompt + target)


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
