"""``methods.attribute_generation``: which part of the prompt made the model say this?

Captum's ``LLMAttribution`` / ``LLMGradientAttribution`` semantics (see the README), on
the engine's own methods. The answer being explained is the target's log-probability under
teacher forcing: ``seq_attr`` attributes its sum over the target tokens, ``token_attr`` each
token's. Perturbation methods see the model as a function of the feature-presence vector
(ones: the prompt as given) and run unchanged through ``methods.attribute``; what is fast is
that function (``scorer``). Gradient methods run at the model's token embedding, summed over
the embedding dim per prompt token (``gradient``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods.api import attribute
from methods.engine import precision as precision_
from methods.engine.precision import Fidelity
from methods.errors import InvalidArgumentError, InvalidTypeError
from methods.generation import chat, gradient, targets
from methods.generation import precision as at_precision
from methods.generation.catalog import (
    METHODS,
    PER_OUTPUT,
    PERTURBATION,
    check_length,
)
from methods.generation.errors import (
    EmptyTargetError,
    TargetTooLongError,
    UnsupportedGenerationMethodError,
)
from methods.generation.features import Features, TokenFeatures, encode, make_features
from methods.generation.lm import DEFAULT_GEN_ARGS, LanguageModel, Seq2SeqLanguageModel, wrap
from methods.generation.scorer import Scorer
from methods.progress import shown as show_progress

#: params attribute_generation sets itself
RESERVED = ("feature_mask", "layer", "target", "baselines", "additional_forward_args")


@dataclass(frozen=True)
class GenerationResult:
    """What ``attribute_generation`` returns (Captum's ``LLMAttributionResult``, plus echoes)."""

    #: one label per feature: the prompt's tokens, or the template's slot values
    input_tokens: list[str]
    #: the target's tokens
    output_tokens: list[str]
    #: one score per feature for the whole target's log-probability: [n_features]
    seq_attr: Tensor
    #: one row per target token: [n_target_tokens, n_features]
    token_attr: Tensor
    #: the method that ran (a layer method for saliency / input_x_gradient)
    method: str
    #: the target's token ids
    output_ids: list[int]
    #: log-probability of each target token after the unperturbed prompt: [n_target_tokens]
    output_log_probs: Tensor
    #: what was attributed (``targets.TARGET_FNS``) and its value per target token after the
    #: unperturbed prompt: [n_target_tokens] (seq_attr attributes their sum)
    target_fn: str = "log_prob"
    output_scores: Tensor | None = None
    #: the unperturbed answer's steps: probability, entropy and rank of each target token
    step_scores: dict[str, list[Any]] = field(default_factory=dict)
    #: every effective parameter
    params: dict[str, Any] = field(default_factory=dict)
    #: how the work was done: forwards, prompts evaluated, tokens run and taken from the cache
    stats: dict[str, int] = field(default_factory=dict)
    #: what the precision cost (``methods.engine.precision.Fidelity``; CONTRACT 8.1)
    fidelity: Fidelity | None = None

    @property
    def attributions(self) -> Tensor:
        """What a precision's check compares: ``seq_attr`` as one example [1, n_features]."""
        return self.seq_attr[None]

    @property
    def convergence_delta(self) -> None:
        """No completeness delta: the features are tokens, not a path's inputs."""
        return None


def attribute_generation(
    model: Any,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    method: str = "feature_ablation",
    target: str | Tensor | list[int] | None = None,
    features: list[str] | dict[str, str] | str | None = None,
    baselines: Any = None,
    gen_args: dict[str, Any] | None = None,
    *,
    skip_tokens: list[int] | list[str] | None = None,
    seed: int | None = None,
    perturbations_per_eval: int | str | None = None,
    internal_batch_size: int | str | None = "auto",
    use_cache: bool = True,
    progress: bool = False,
    target_fn: str = "log_prob",
    contrast_target: str | Tensor | list[int] | None = None,
    contrast_fn: str = "log_prob",
    step_scores: list[str] | None = None,
    precision: str | None = None,
    verify: bool = False,
    fidelity_tolerance: float | None = None,
    **params: Any,
) -> GenerationResult:
    """Attribute a causal LM's answer ``target`` (None: generated greedily with ``gen_args``,
    Captum's defaults: 25 new tokens) to the features of ``prompt``.

    ``features`` None: every prompt token (except ``skip_tokens``) is a feature and
    ``baselines`` is the token standing for an absent one (an id or a token string; default
    id 0). Otherwise ``prompt`` is a template with ``{}`` slots (``{name}`` for a dict) and
    ``features`` their values; ``baselines`` their replacements (default ``""``).
    ``perturbations_per_eval``: perturbed prompts per model forward, and
    ``internal_batch_size``: rows per forward+backward of the gradient methods (default: the
    memory budget decides both; a 50-step layer IG of GPT-2 small in one pass needs ~26 GB).
    ``use_cache=False`` runs every prompt whole (same numbers, slower).
    ``prompt`` may be a conversation, a list of ``{"role", "content"}`` messages, rendered by
    the tokenizer's chat template (``chat``); ``features`` is then ``"turns"`` (each message a
    feature, the default), ``"sentences"`` or ``"tokens"``.
    ``target_fn``: what is attributed of each target token (``targets``: ``log_prob``,
    ``prob``, ``logit``, ``entropy``, or ``contrast``: its ``contrast_fn`` value minus
    ``contrast_target``'s token paired with that step, as inseq pairs them: from the end).
    ``step_scores``: which per-step scores of the unperturbed answer the result carries
    (``"probability"``, ``"entropy"``, ``"rank"``; None: all three).
    ``params``: the method's own (``n_samples``, ``n_steps``, ...).
    ``precision``, ``verify`` and ``fidelity_tolerance``: as for ``methods.attribute``, the
    model's forwards (and backwards) in that dtype, with the result's ``fidelity``
    (``methods.generation.precision``).
    """
    shown = targets.check_step_scores(step_scores)
    prec = precision_.check_precision(precision)
    tolerance = precision_.check_tolerance(fidelity_tolerance)
    at_precision.check_verify(prec, verify)
    lm, feats = prepare(
        model, tokenizer, prompt, method, features, baselines, skip_tokens, params,
        use_cache=use_cache, progress=progress, target_fn=target_fn,
        contrast_target=contrast_target, contrast_fn=contrast_fn,
    )  # fmt: skip
    answer, asked = target, gen_args
    if at_precision.needs_runs(model, prec, verify):
        # one answer for every precision: the model's own, generated once
        answer, asked = _target_ids(lm, tokenizer, feats, target, gen_args), None
        seed = at_precision.same_samples(method, seed)

    def run(m: Any) -> GenerationResult:
        """The attribution on ``m``: the model as given, or its copy in a precision."""
        on = lm if m is model else wrap(m)
        target_ids = _target_ids(on, tokenizer, feats, answer, asked)
        contrast = None
        if contrast_target is not None:
            contrast = contrast_steps(on, feats, target_ids, tokenizer, contrast_target)
        objective = targets.Objective(target_ids, target_fn, contrast_fn, contrast)
        scored: Tensor | None = None  # the unperturbed prompt's logits, where a scorer kept them
        with show_progress(progress, method):
            if method in PERTURBATION:
                seq, tok, ran, echo, stats, scored = _perturbation(
                    on, feats, objective, method, seed, perturbations_per_eval, use_cache, params
                )
            else:
                seq, tok, ran, echo, stats = gradient.run(
                    on, token_features(method, feats), objective, method, seed,
                    internal_batch_size, params,
                )  # fmt: skip
        return finish(
            on, tokenizer, feats, objective, seq, tok, ran, echo, stats,
            use_cache=use_cache, gen_args=asked, target=answer, logits=scored,
            step_scores=shown,
        )  # fmt: skip

    result = at_precision.run_at(model, method, prec, verify, tolerance, run)
    if target is None and answer is not None:  # generated once for every precision
        echo = {**result.params, "gen_args": dict(gen_args or DEFAULT_GEN_ARGS)}
        result = dataclasses.replace(result, params=echo)
    return result


def prepare(
    model: Any,
    tokenizer: Any,
    prompt: Any,
    method: str,
    features: Any,
    baselines: Any,
    skip_tokens: Any,
    params: dict[str, Any],
    *,
    use_cache: Any,
    progress: Any,
    target_fn: Any,
    contrast_target: Any,
    contrast_fn: Any,
) -> tuple[LanguageModel, Features]:
    """The checks every generation request passes, and the model's adapter and the prompt's
    features."""
    if method not in METHODS:
        raise UnsupportedGenerationMethodError(
            f"{method!r} cannot attribute a generated answer; use one of {list(METHODS)}",
            argument="method",
        )
    for name in RESERVED:
        if name in params:
            raise InvalidArgumentError(
                f"{name} is set by attribute_generation from the prompt and its features; "
                "leave it out",
                argument=name,
            )
    if not isinstance(use_cache, bool):
        raise InvalidTypeError("use_cache must be a bool", argument="use_cache")
    if not isinstance(progress, bool):
        raise InvalidTypeError("progress must be a bool", argument="progress")
    targets.check(target_fn, contrast_target, contrast_fn)
    if chat.is_chat(prompt):
        if chat.kind(features) == "turns":
            if skip_tokens is not None:
                raise InvalidArgumentError(
                    "skip_tokens applies to token features; with messages the features are "
                    "the turns",
                    argument="skip_tokens",
                )
            return wrap(model), chat.TurnFeatures(tokenizer, prompt, baselines)
        prompt, features = chat.render(tokenizer, prompt, features)
    elif isinstance(features, str):
        raise InvalidTypeError(
            'features "turns", "sentences" or "tokens" apply to a conversation (messages); '
            "with a prompt text, give the slots' values (a list or dict) or None",
            argument="features",
        )
    if not isinstance(prompt, str):
        raise InvalidTypeError("prompt must be a text or a list of messages", argument="prompt")
    lm = wrap(model)
    return lm, make_features(tokenizer, prompt, features, baselines, skip_tokens)


def token_features(method: str, feats: Features) -> TokenFeatures:
    """The prompt's tokens as features, which a gradient method needs."""
    if not isinstance(feats, TokenFeatures):
        raise UnsupportedGenerationMethodError(
            f"{method} differentiates through the token embedding, which needs the prompt's "
            "tokens as the features; template slots (which may change the prompt's length) "
            f"take a perturbation method: {list(PERTURBATION)}",
            argument="method",
        )
    return feats


def finish(
    lm: LanguageModel,
    tokenizer: Any,
    feats: Features,
    objective: targets.Objective,
    seq: Tensor,
    tok: Tensor,
    ran: str,
    echo: dict[str, Any],
    stats: dict[str, int],
    *,
    use_cache: bool,
    gen_args: Any,
    target: Any,
    logits: Tensor | None = None,
    step_scores: tuple[str, ...] | None = None,
) -> GenerationResult:
    """The result, with the unperturbed answer's score table (from ``logits``, the prompt's
    logits at the answer's steps [T, V], or one forward)."""
    target_fn, contrast_fn = objective.target_fn, objective.contrast_fn
    target_ids = objective.target
    echo.update({"use_cache": use_cache, "target_fn": target_fn})
    if target_fn == "contrast":
        echo.update({"contrast_fn": contrast_fn, "contrast_ids": objective.contrast_list()})
    table, logp, scores = _step_table(lm, feats, objective, logits)
    if step_scores is not None:
        table = {k: v for k, v in table.items() if k in step_scores}
    if gen_args is not None or target is None:
        echo["gen_args"] = dict(gen_args or DEFAULT_GEN_ARGS)
    return GenerationResult(
        input_tokens=list(feats.labels),
        output_tokens=_pretty(tokenizer, target_ids.tolist()),
        seq_attr=seq,
        token_attr=tok,
        method=ran,
        output_ids=[int(i) for i in target_ids.tolist()],
        output_log_probs=logp,
        params=echo,
        stats=stats,
        target_fn=target_fn,
        output_scores=scores,
        step_scores=table,
    )


def _step_table(
    lm: LanguageModel,
    feats: Features,
    objective: targets.Objective,
    logits: Tensor | None = None,
) -> tuple[dict[str, Any], Tensor, Tensor]:
    """From the unperturbed prompt's logits at the answer's steps (``logits``, or one
    forward), in the model's dtype: the score table (``targets.step_table``), each step's
    log-probability, and the attributed value of each step (``objective``)."""
    target_ids = objective.target
    with torch.no_grad():
        if logits is None and isinstance(lm, Seq2SeqLanguageModel):
            logits = lm.target_logits([feats.prompt_ids()], target_ids)[0]
        elif logits is None:
            prompt = torch.tensor([feats.prompt_ids()], dtype=torch.long)
            fed = target_ids.reshape(1, -1)[:, :-1]  # the last answer token predicts nothing
            ids = torch.cat([prompt, fed], dim=1).to(lm.device)
            logits = lm.logits(ids, keep_from=prompt.shape[1] - 1)[0]
    logp = targets.log_prob(logits[None], target_ids)[0].detach().cpu()
    scores = objective.step_fn()(logits[None], target_ids.to(logits.device))[0].detach().cpu()
    return targets.step_table(logits, target_ids), logp, scores


def contrast_steps(
    lm: LanguageModel, feats: Features, target: Tensor, tokenizer: Any, contrast: Any
) -> Tensor:
    """The contrast answer's token compared at each target step (``targets.align``: inseq's
    right-aligned default, after the prompt or the decoder's start token)."""
    ids = _given_ids(tokenizer, contrast, "contrast_target", lm.seq2seq)
    prefix = [lm.start] if isinstance(lm, Seq2SeqLanguageModel) else list(feats.prompt_ids())
    return targets.align(target, ids, prefix)


def _given_ids(tokenizer: Any, value: Any, argument: str, seq2seq: bool = False) -> Tensor:
    """An answer given as text or token ids, as a 1-D id tensor (none empty). An
    encoder-decoder's answer is tokenized as a target (``text_target``: Marian's target
    vocabulary), without special tokens (no end of sequence appended)."""
    if isinstance(value, str):
        if seq2seq and callable(tokenizer):
            ids = tokenizer(text_target=value, add_special_tokens=False)["input_ids"]
        else:
            ids = encode(tokenizer, value, add_special_tokens=False)
        out = torch.tensor([int(i) for i in ids], dtype=torch.long)
    elif isinstance(value, Tensor) and not value.is_floating_point() and value.dim() <= 1:
        out = value.detach().to("cpu", torch.long).reshape(-1)
    elif isinstance(value, (list, tuple)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        out = torch.tensor(list(value), dtype=torch.long)
    else:
        raise InvalidTypeError(
            f"{argument} must be the answer's text or its token ids (a 1-D integer tensor or a "
            f"list of ints); got {type(value).__name__}",
            argument=argument,
        )
    if out.numel() == 0:
        raise EmptyTargetError(f"the {argument} {value!r} has no tokens", argument=argument)
    return out


def _target_ids(
    lm: LanguageModel, tokenizer: Any, feats: Features, target: Any, gen_args: Any
) -> Tensor:
    prompt = feats.prompt_ids()
    limit = lm.max_length
    if target is None:
        if gen_args is not None and not isinstance(gen_args, dict):
            raise InvalidTypeError("gen_args must be a dict or None", argument="gen_args")
        new = (gen_args or DEFAULT_GEN_ARGS).get(
            "max_new_tokens", DEFAULT_GEN_ARGS["max_new_tokens"]
        )
        over = isinstance(new, int) and (
            max(len(prompt), new) if lm.seq2seq else len(prompt) + new
        ) > (limit or 0)
        if limit is not None and over:
            raise TargetTooLongError(
                f"the prompt has {len(prompt)} tokens and max_new_tokens is {new}: more than "
                f"the {limit} positions the model attends to; lower max_new_tokens",
                argument="gen_args",
            )
        ids = torch.tensor([prompt], dtype=torch.long, device=lm.device)
        with torch.no_grad():
            out = lm.generate(ids, dict(gen_args or {}), getattr(tokenizer, "eos_token_id", None))
        out = out.detach().to("cpu", torch.long).reshape(-1)
        if out.numel() == 0:
            raise EmptyTargetError("the model generated no tokens", argument="target")
        return out
    if gen_args is not None:
        raise InvalidArgumentError(
            "gen_args apply only when the target is generated (target=None)", argument="gen_args"
        )
    if not isinstance(target, (str, Tensor, list, tuple)):
        raise InvalidTypeError(
            "target must be the answer's text, its token ids (a 1-D integer tensor or a list of "
            f"ints), or None to generate it; got {type(target).__name__}",
            argument="target",
        )
    return _given_ids(tokenizer, target, "target", lm.seq2seq)


class _Presence:
    """The model as a function of feature presence: [B, F] -> [B, 1 + T] step values (the
    target's total, then each token's)."""

    def __init__(self, feats: Features, scorer: Scorer, lm: LanguageModel) -> None:
        self.feats, self.scorer, self.lm = feats, scorer, lm

    def __call__(self, present: Tensor) -> Tensor:
        prompts = self.feats.ids(present == 1)
        check_length(self.lm, prompts, self.scorer.t)
        v = self.scorer.score(prompts).to(present.device)
        return torch.cat([v.sum(1, keepdim=True), v], dim=1)


def _perturbation(
    lm: LanguageModel,
    feats: Features,
    objective: targets.Objective,
    method: str,
    seed: int | None,
    ppe: int | str | None,
    use_cache: bool,
    params: dict[str, Any],
) -> tuple[Tensor, Tensor, str, dict[str, Any], dict[str, int], Tensor | None]:
    if (
        ppe is not None
        and ppe != "auto"
        and (isinstance(ppe, bool) or not isinstance(ppe, int) or ppe < 1)
    ):
        raise InvalidArgumentError(
            f"perturbations_per_eval must be a positive int, 'auto' or None, got {ppe!r}",
            argument="perturbations_per_eval",
        )
    n = feats.n
    absent = feats.ids(torch.zeros(1, n, dtype=torch.bool))[0]
    target_ids = objective.target

    scorer = Scorer(
        lm,
        target_ids.to(lm.device),
        references=[feats.prompt_ids(), absent],
        use_cache=use_cache,
        max_rows=ppe if isinstance(ppe, int) else None,
        fn=objective.step_fn(),
    )
    f = _Presence(feats, scorer, lm)
    ones = torch.ones(1, n, dtype=lm.dtype)
    t = int(target_ids.numel())
    # Every perturbation of one engine chunk reaches the scorer at once; it decides the forwards.
    everything = 1 << 20
    common: dict[str, Any] = {"baselines": 0, "perturbations_per_eval": everything}
    if method in PER_OUTPUT:
        res = attribute(f, ones, method, seed=seed, **common, **params)
        attrs = res.attributions
        if not isinstance(attrs, Tensor):
            raise TypeError("unexpected attribution form")  # one input: one tensor
        rows = attrs.reshape(1 + t, n)
    else:
        # The same coalitions for the total and every token: a drawn seed when none is given.
        s = seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item())
        parts = []
        for j in range(1 + t):
            res = attribute(f, ones, method, target=j, seed=s, **common, **params)
            a = res.attributions
            if not isinstance(a, Tensor):
                raise TypeError("unexpected attribution form")
            parts.append(a.reshape(n))
        rows = torch.stack(parts)
    echo = {k: v for k, v in res.params.items() if k != "perturbations_per_eval"}
    echo["perturbations_per_eval"] = ppe if ppe is not None else "auto"
    echo["seed"] = seed
    st = scorer.stats
    stats = {
        "forwards": st.forwards,
        "prompts": st.rows,
        "max_prompts_per_forward": st.max_rows,
        "tokens_run": st.tokens,
        "tokens_from_cache": st.cached_tokens,
    }
    scored = scorer.logits_of(feats.prompt_ids())
    return rows[0].detach(), rows[1:].detach(), method, echo, stats, scored


def _pretty(tokenizer: Any, ids: list[int]) -> list[str]:
    """One readable string per target token (BPE's space markers decoded away)."""
    raw = tokenizer.convert_ids_to_tokens(ids)
    out = []
    for i, tok in zip(ids, raw, strict=True):
        text = tokenizer.decode([i]).strip()
        out.append(text if text else str(tok))
    return out
