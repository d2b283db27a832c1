"""TCAV: how much a class's prediction leans on a human concept (Kim et al., 2018,
https://arxiv.org/abs/1711.11279), Captum's ``TCAV`` with significance testing built in.

For each concept, layer and random set a CAV is trained (``methods.concepts.cav``); with g the
gradient of the target at the layer (flattened) per input, ``sign_count`` = mean(g . cav > 0)
as Captum's, and ``magnitude`` = sum |g . cav| [g . cav > 0] / sum |g . cav| as the original
TCAV library's (Captum's is mean(g . cav) on its unnormalised weights). CAVs of every ordered
pair of random sets give the null distribution, and ``p_value`` is a pooled two-sided t-test
of the concept's sign counts against theirs.

The pieces are public so a server can keep the costly ones: ``layer_activations`` of a
concept's examples, ``train_cav`` per (concept, random set, layer), ``layer_gradients`` of the
inputs, and ``score_rows`` to put them together.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods.api import attribute
from methods.concepts.cav import Cav, check_classifier, train_cav
from methods.concepts.stats import ttest_ind
from methods.errors import AttributionError, InvalidArgumentError, InvalidTypeError

#: examples per forward when reading a set's activations or the inputs' gradients
BATCH = 64

#: a CAV trainer: (concept activations, random activations) -> Cav
Trainer = Callable[[Tensor, Tensor], Cav]


@dataclass
class TCAVResult:
    """``scores``: one row per (concept, layer); ``cavs[concept][layer]``: ``(n_random, D)``
    unit vectors towards the concept, one per random set in ``random_concepts`` order."""

    scores: list[dict[str, Any]]
    cavs: dict[str, dict[str, Tensor]] = field(default_factory=dict)


def check_layers(model: Any, layers: object) -> list[str]:
    from methods.engine.layers import resolve

    paths = [layers] if isinstance(layers, str) else layers
    if not isinstance(paths, (list, tuple)) or not paths:
        raise InvalidArgumentError(
            f"layers must be a layer path or a non-empty list of them, got {layers!r}",
            argument="layers",
        )
    if len(set(paths)) != len(paths):
        raise InvalidArgumentError("layers names a layer more than once", argument="layers")
    for p in paths:
        try:
            resolve(model, p)
        except AttributionError as e:
            raise type(e)(str(e), argument="layers") from None
    return list(paths)


def _flat(values: Any) -> Tensor:
    parts = values if isinstance(values, (tuple, list)) else (values,)
    return torch.cat([v.reshape(v.shape[0], -1) for v in parts], dim=1)


def _rows(inputs: Any) -> int:
    first = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
    if not isinstance(first, Tensor) or first.dim() == 0:
        raise InvalidTypeError(
            "examples must be a tensor (or a tuple of tensors) with the examples along dim 0",
            argument="inputs",
        )
    return first.shape[0]


def _chunks(inputs: Any, n: int) -> list[Any]:
    if isinstance(inputs, (tuple, list)):
        return [tuple(x[s : s + BATCH] for x in inputs) for s in range(0, n, BATCH)]
    return [inputs[s : s + BATCH] for s in range(0, n, BATCH)]


def _per_layer(
    model: Any, inputs: Any, layers: list[str], method: str, argument: str, **kw: Any
) -> dict[str, Tensor]:
    n = _rows(inputs)
    if n == 0:
        raise InvalidArgumentError(f"{argument} has no examples", argument=argument)
    parts: dict[str, list[Tensor]] = {p: [] for p in layers}
    for chunk in _chunks(inputs, n):
        try:
            out = attribute(model, chunk, method, layer=list(layers), **kw).attributions
        except AttributionError as e:
            at = e.argument if e.argument == "target" else argument
            raise type(e)(str(e), argument=at) from e
        for p, values in zip(layers, out, strict=True):
            parts[p].append(_flat(values).detach())
    return {p: torch.cat(v) for p, v in parts.items()}


def layer_activations(model: Any, examples: Any, layers: list[str]) -> dict[str, Tensor]:
    """Each layer's output for ``examples``, flattened: ``{layer: (n, D)}``."""
    return _per_layer(model, examples, layers, "layer_activation", "concepts")


def layer_gradients(
    model: Any,
    inputs: Any,
    layers: list[str],
    target: Any = None,
    additional_forward_args: Any = None,
) -> dict[str, Tensor]:
    """The gradient of the targeted output at each layer's output: ``{layer: (N, D)}``."""
    if target is not None and isinstance(target, Tensor) and target.dim() > 0:
        target = target.tolist()
    if isinstance(target, list) and len(target) != _rows(inputs):
        raise InvalidArgumentError(
            f"target has {len(target)} entries for {_rows(inputs)} inputs", argument="target"
        )
    # per chunk of inputs, so a per-example target is cut with them
    n = _rows(inputs)
    out: dict[str, list[Tensor]] = {p: [] for p in layers}
    for s, chunk in zip(range(0, n, BATCH), _chunks(inputs, n), strict=True):
        afa = additional_forward_args
        if isinstance(afa, Tensor) and afa.dim() and afa.shape[0] == n:
            afa = afa[s : s + BATCH]
        got = _per_layer(
            model,
            chunk,
            layers,
            "layer_gradient_x_activation",
            "inputs",
            multiply_by_inputs=False,
            target=target[s : s + BATCH] if isinstance(target, list) else target,
            additional_forward_args=afa,
        )
        for p in layers:
            out[p].append(got[p])
    return {p: torch.cat(v) for p, v in out.items()}


def signs_and_magnitudes(grads: Tensor, cavs: Sequence[Cav]) -> tuple[list[float], list[float]]:
    """Captum's sign count and the original library's bounded magnitude of each CAV, from
    one product of the gradients (N, D) with the CAVs stacked (D, K)."""
    s = grads.to(torch.float64) @ torch.stack([c.vector for c in cavs], 1).to(torch.float64)
    total = s.abs().sum(0)
    positive = s.clamp_min(0).sum(0)
    magnitude = torch.where(total > 0, positive / total.clamp_min(1e-300), 0.0)
    return (s > 0).to(torch.float64).mean(0).tolist(), magnitude.tolist()


def score_rows(
    grads: Mapping[str, Tensor],
    cavs: Mapping[str, Mapping[str, Sequence[Cav]]],
    null_cavs: Mapping[str, Sequence[Cav]],
    alpha: float,
) -> list[dict[str, Any]]:
    """One row per (concept, layer): ``cavs[concept][layer]`` one per random set,
    ``null_cavs[layer]`` the random-vs-random ones."""
    null = {p: signs_and_magnitudes(grads[p], found)[0] for p, found in null_cavs.items()}
    rows = []
    for concept, per_layer in cavs.items():
        for layer, found in per_layer.items():
            signs, mags = signs_and_magnitudes(grads[layer], found)
            _, p = ttest_ind(signs, null[layer])
            significant = not math.isnan(p) and p < alpha
            sign_count = sum(signs) / len(signs)
            random_sign_count = sum(null[layer]) / len(null[layer])
            verdict = "not significant"
            if significant:
                verdict = "for" if sign_count > random_sign_count else "against"
            rows.append(
                {
                    "concept": concept,
                    "layer": layer,
                    "sign_count": sign_count,
                    "magnitude": sum(mags) / len(mags),
                    "sign_counts": signs,
                    "random_sign_count": random_sign_count,
                    "p_value": None if math.isnan(p) else p,
                    "significant": significant,
                    "verdict": verdict,
                    "cav_accuracy": sum(c.accuracy for c in found) / len(found),
                }
            )
    return rows


def check_sets(concepts: object, random_concepts: object) -> None:
    if not isinstance(concepts, Mapping) or not concepts:
        raise InvalidTypeError(
            "concepts must map a concept's name to its example inputs", argument="concepts"
        )
    if not isinstance(random_concepts, Mapping) or len(random_concepts) < 2:
        raise InvalidArgumentError(
            "random_concepts must map at least 2 names to example inputs: the CAVs of random "
            "sets against each other are the null distribution of the significance test",
            argument="random_concepts",
        )
    both = sorted(set(concepts) & set(random_concepts))
    if both:
        raise InvalidArgumentError(
            f"{both} are both concepts and random sets; name each set once",
            argument="random_concepts",
        )


def check_alpha(alpha: object) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise InvalidArgumentError(
            f"alpha must be a number between 0 and 1, got {alpha!r}", argument="alpha"
        )
    return float(alpha)


def tcav(
    model: Any,
    inputs: Any,
    concepts: Mapping[str, Any],
    layers: str | Sequence[str],
    *,
    target: Any = None,
    random_concepts: Mapping[str, Any],
    additional_forward_args: Any = None,
    classifier: str = "logistic",
    alpha: float = 0.05,
    seed: int | None = None,
) -> TCAVResult:
    """TCAV scores of ``concepts`` at ``layers`` for ``model``'s ``target`` on ``inputs``.

    ``concepts`` and ``random_concepts`` map a name to example inputs in the model's input
    form; ``seed`` picks the held-out examples of each CAV (None: 0, so a call is repeatable).
    """
    check_sets(concepts, random_concepts)
    paths = check_layers(model, layers)
    kind = check_classifier(classifier)
    level = check_alpha(alpha)
    acts = {
        name: layer_activations(model, examples, paths)
        for name, examples in {**concepts, **random_concepts}.items()
    }
    grads = layer_gradients(model, inputs, paths, target, additional_forward_args)
    for p in paths:
        for name in acts:
            if acts[name][p].shape[1] != grads[p].shape[1]:
                raise InvalidArgumentError(
                    f"at layer {p!r} the set {name!r} has {acts[name][p].shape[1]} features "
                    f"and the inputs {grads[p].shape[1]}; concept examples must have the "
                    "inputs' shape",
                    argument="concepts",
                )
    s = 0 if seed is None else seed

    def fit(pos: str, neg: str, p: str) -> Cav:
        return train_cav(acts[pos][p], acts[neg][p], classifier=kind, seed=s)

    randoms = list(random_concepts)
    cavs = {c: {p: [fit(c, r, p) for r in randoms] for p in paths} for c in concepts}
    null = {p: [fit(a, b, p) for a in randoms for b in randoms if a != b] for p in paths}
    return TCAVResult(
        scores=score_rows(grads, cavs, null, level),
        cavs={
            c: {p: torch.stack([v.vector for v in found]) for p, found in per.items()}
            for c, per in cavs.items()
        },
    )
