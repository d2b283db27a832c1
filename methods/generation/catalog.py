"""Which methods ``attribute_generation`` runs, and how: read off each method's registry entry
(``MethodSpec.generation``), not listed by name."""

from __future__ import annotations

from typing import Any

from methods import registry
from methods.generation.errors import TargetTooLongError, UnsupportedGenerationMethodError
from methods.generation.lm import LanguageModel


def _named(trait: str) -> tuple[str, ...]:
    return tuple(s.name for s in registry.specs() if s.generation == trait)


#: perturbation methods whose attributions cover every output value at once (Captum's
#: per-token methods): the model's output is [total, token 1, ..., token T] per prompt
PER_OUTPUT = _named("per_output")
#: surrogate fits: one per output value, over the same (seeded) coalitions
FITTED = _named("fitted")
PERTURBATION = PER_OUTPUT + FITTED
#: gradient methods at the embedding layer (saliency, input_x_gradient, integrated_gradients
#: reach them through their registered token counterparts)
LAYER_GRADIENT = _named("layer_gradient")
METHODS = (*PERTURBATION, *LAYER_GRADIENT, *_named("gradient"))


def check_length(lm: LanguageModel, prompts: list[tuple[int, ...]], t: int) -> None:
    """Prompt plus target must fit the model's positions."""
    limit = lm.max_length
    if limit is None or not prompts:
        return
    longest = max(len(q) for q in prompts)
    if lm.seq2seq:  # the source and the answer each have the model's positions
        if max(longest, t) > limit:
            raise TargetTooLongError(
                f"a source of {longest} tokens and a target of {t} tokens: the model attends "
                f"to {limit} positions on each side",
                argument="target" if t > limit else "prompt",
            )
        return
    if longest + t > limit:
        raise TargetTooLongError(
            f"a prompt of {longest} tokens and a target of {t} tokens need {longest + t} "
            f"positions; the model attends to {limit}",
            argument="target",
        )


def counterpart(method: str) -> tuple[str, dict[str, Any], bool]:
    """The layer method a gradient method runs as at the embedding: (name, params, post_abs)."""
    if method in LAYER_GRADIENT:
        return method, {}, False
    tc = registry.get(method).token_counterpart
    if tc is None:  # pragma: no cover - every name in METHODS has one
        raise UnsupportedGenerationMethodError(
            f"{method} has no layer counterpart", argument="method"
        )
    return tc.method, dict(tc.set_params), tc.post_abs
