"""``methods.attribute_context``: which part of the context supports each sentence of the answer?

ContextCite (Cohen-Wang et al. 2024): the context is cut into units (sentences, paragraphs,
documents); ``n_ablations`` random subsets of them are kept (each unit with probability
``keep_prob``), and for each subset the model scores every answer sentence, teacher-forced, by
its summed log-probability after the prompt built from the kept units. A sparse linear
surrogate (Lasso, ContextCite's regularisation) fitted per answer sentence from the 0/1 kept
vector to that score gives each unit's weight: how much keeping it raises the sentence's
log-probability. ``fit.r2`` says how far to trust it: the R² on a held-out 20% of the ablations
of the same surrogate fitted on the other 80%.

What is the same as the ``context-cite`` package (0.0.4): the ablation masks for a seed
(``numpy.random.RandomState(seed + i)``, ``i`` the ablation), the joined ablated context,
the prompt through the tokenizer's chat template when it has one (one user message, the
generation prompt added), the scaling of the surrogate (standardised masks, the score divided
by the tokens scored, ``Lasso(alpha=0.01)``) and, with ``score="logit_prob"``, its default
score (the log-odds of the sentence's probability). What is faster: the ablations are scored in
batched forwards, the answer's tokens teacher-forced behind each prompt, the key/value cache of
the prompt's common start reused and the vocabulary's logits computed only where the answer is
(``scorer``); every answer sentence comes from the same forwards.
"""

from __future__ import annotations

import bisect
import difflib
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from methods.engine.linear_models import lasso
from methods.errors import InvalidArgumentError, InvalidTypeError, positive_number
from methods.generation import units as units_
from methods.generation.catalog import check_length
from methods.generation.errors import EmptyTargetError, TargetTooLongError
from methods.generation.features import encode
from methods.generation.lm import DEFAULT_GEN_ARGS, LanguageModel, wrap
from methods.generation.scorer import Scorer
from methods.progress import shown as show_progress

DEFAULT_TEMPLATE = "{context}\n\n{query}"
#: when the answer is generated: greedy, this many new tokens at most
CONTEXT_GEN_ARGS: dict[str, Any] = {**DEFAULT_GEN_ARGS, "max_new_tokens": 64}
SCORES = ("log_prob", "logit_prob")
#: the fewest ablations: the held-out fifth must hold two to measure R² on
MIN_ABLATIONS = 8
HELD_OUT = 0.2


@dataclass(frozen=True)
class ContextResult:
    """What ``attribute_context`` returns."""

    #: the context's units (the features)
    units: list[str]
    #: the answer attributed: as given, or the generated tokens decoded
    answer: str
    #: its sentences, each ``answer[start:end]`` of ``answer_spans``
    answer_sentences: list[str]
    #: each answer sentence's [start, end) character offsets in ``answer``
    answer_spans: list[tuple[int, int]]
    #: the surrogate's weight of each unit, per answer sentence: [sentences, units]
    scores: Tensor
    #: per answer sentence, the units best first
    top: list[list[int]]
    #: ``r2``: per answer sentence, the held-out R² (None where the held-out scores are equal)
    fit: dict[str, list[float | None]]
    #: the surrogate's intercept per answer sentence (the score with no unit kept)
    intercepts: Tensor
    #: the ablations: [n_ablations, units], True = kept
    masks: Tensor
    #: each ablation's score of each answer sentence: [n_ablations, sentences]
    outputs: Tensor
    #: the answer's token ids and, per answer sentence, its [start, stop) token range
    answer_ids: list[int] = field(default_factory=list)
    sentence_tokens: list[tuple[int, int]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def attribute_context(
    model: Any,
    tokenizer: Any,
    context: str | list[str],
    query: str,
    answer: str | None = None,
    *,
    units: str = "sentences",
    unit_pattern: str | None = None,
    n_ablations: int = 64,
    seed: int = 0,
    prompt_template: str | None = None,
    keep_prob: float = 0.5,
    score: str = "log_prob",
    alpha: float = 0.01,
    gen_args: dict[str, Any] | None = None,
    perturbations_per_eval: int | None = None,
    use_cache: bool = True,
    progress: bool = False,
) -> ContextResult:
    """Rank the units of ``context`` by how much each supports each sentence of ``answer``
    (None: generated greedily from the whole prompt with ``gen_args``, 64 new tokens by
    default), the model answering ``query``. A given answer is kept as given (not as the
    tokenizer decodes it) and its sentences are cut in it (``answer_spans``).

    ``units``: "sentences", "paragraphs" or "documents" (each text of a list), or the pieces
    between matches of ``unit_pattern``. ``prompt_template`` (default ``"{context}\\n\\n{query}"``)
    builds the prompt, through the tokenizer's chat template when it has one. ``score``:
    "log_prob" (the sentence's summed log-probability) or "logit_prob" (its log-odds,
    ContextCite's default). ``perturbations_per_eval``: the most prompts per forward (default:
    the memory budget decides).
    """
    _check_args(query, n_ablations, seed, keep_prob, score, alpha, perturbations_per_eval)
    if not isinstance(use_cache, bool):
        raise InvalidTypeError("use_cache must be a bool", argument="use_cache")
    template = check_template(prompt_template)
    parts = units_.split(context, units, unit_pattern)
    lm = wrap(model)

    def prompt_ids(keep: list[bool] | None) -> tuple[int, ...]:
        return tuple(
            encode_prompt(tokenizer, template.format(context=parts.join(keep), query=query))
        )

    full = prompt_ids(None)
    answer_ids, text = _answer(lm, tokenizer, full, answer, gen_args)
    sent_spans = units_.sentence_spans(text) or [(0, len(text))]
    ranges = _token_ranges(tokenizer, answer_ids, text, sent_spans)
    masks = ablation_masks(n_ablations, len(parts), keep_prob, seed)
    prompts = [prompt_ids(m.tolist()) for m in masks]
    t = len(answer_ids)
    check_length(lm, [full, *prompts], t)
    target = torch.tensor(answer_ids, dtype=torch.long, device=lm.device)
    scorer = Scorer(
        lm,
        target,
        references=[full, prompt_ids([False] * len(parts))],
        use_cache=use_cache,
        max_rows=perturbations_per_eval,
    )
    with show_progress(progress, "context attribution"):
        steps = scorer.score(prompts).detach().to("cpu", torch.float64)  # [A, T]
    sums = torch.stack([steps[:, a:b].sum(1) for a, b in ranges], dim=1)  # [A, S]
    outputs = _logit_prob(sums) if score == "logit_prob" else sums
    x = torch.as_tensor(masks, dtype=torch.float64)
    counts = torch.tensor([b - a for a, b in ranges], dtype=torch.float64)
    weights, bias = surrogate(x, outputs, counts, alpha)
    r2 = held_out_r2(x, outputs, counts, alpha, seed)
    top = [_ranked(w) for w in weights]
    st = scorer.stats
    return ContextResult(
        units=list(parts.parts),
        answer=text,
        answer_sentences=[text[a:b] for a, b in sent_spans],
        answer_spans=sent_spans,
        scores=weights,
        top=top,
        fit={"r2": r2},
        intercepts=bias,
        masks=torch.as_tensor(masks),
        outputs=outputs,
        answer_ids=answer_ids,
        sentence_tokens=ranges,
        params={
            "units": units if unit_pattern is None else "pattern",
            "unit_pattern": unit_pattern,
            "n_ablations": n_ablations,
            "seed": seed,
            "keep_prob": keep_prob,
            "score": score,
            "alpha": alpha,
            "prompt_template": template,
            "chat_template": _has_chat_template(tokenizer),
            "gen_args": dict(gen_args or CONTEXT_GEN_ARGS) if answer is None else None,
            "perturbations_per_eval": perturbations_per_eval,
            "use_cache": use_cache,
        },
        stats={
            "forwards": st.forwards,
            "prompts": st.rows,
            "max_prompts_per_forward": st.max_rows,
            "tokens_run": st.tokens,
            "tokens_from_cache": st.cached_tokens,
        },
    )


def _check_args(query: Any, n: Any, seed: Any, keep: Any, score: Any, alpha: Any, ppe: Any) -> None:
    if not isinstance(query, str):
        raise InvalidTypeError("query must be a text", argument="query")
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_ABLATIONS:
        raise InvalidArgumentError(
            f"n_ablations must be an int of at least {MIN_ABLATIONS} (a fifth is held out to "
            f"measure the surrogate's fit), got {n!r}",
            argument="n_ablations",
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32 - n:
        raise InvalidArgumentError(
            f"seed must be an int from 0 to 2**32 - n_ablations, got {seed!r}", argument="seed"
        )
    if isinstance(keep, bool) or not isinstance(keep, (int, float)) or not 0 < keep < 1:
        raise InvalidArgumentError(
            f"keep_prob must be a number strictly between 0 and 1, got {keep!r}",
            argument="keep_prob",
        )
    if score not in SCORES:
        raise InvalidArgumentError(
            f"score must be one of {list(SCORES)}, got {score!r}", argument="score"
        )
    positive_number(alpha, "alpha", "alpha (the Lasso's penalty)")
    if ppe is not None and (isinstance(ppe, bool) or not isinstance(ppe, int) or ppe < 1):
        raise InvalidArgumentError(
            f"perturbations_per_eval must be a positive int or None, got {ppe!r}",
            argument="perturbations_per_eval",
        )


def check_template(template: Any) -> str:
    if template is None:
        return DEFAULT_TEMPLATE
    if not isinstance(template, str):
        raise InvalidTypeError("prompt_template must be a text", argument="prompt_template")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise InvalidArgumentError(
            f"prompt_template is not a format string ({exc}); write a literal brace as {{{{ "
            "or }}",
            argument="prompt_template",
        ) from None
    if sorted(fields) != ["context", "query"]:
        raise InvalidArgumentError(
            "prompt_template must hold {context} and {query} once each and no other field, "
            f"got fields {fields}",
            argument="prompt_template",
        )
    return template


def _has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None)) and callable(
        getattr(tokenizer, "apply_chat_template", None)
    )


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's ids: as one user message through the chat template when there is one
    (whose text carries its own special tokens), else as the tokenizer encodes a text."""
    if _has_chat_template(tokenizer):
        try:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # the template's own refusal (a system turn required, ...)
            raise InvalidArgumentError(
                "the model's chat template refused the prompt as one user message: "
                f"{' '.join(str(exc).split())}",
                argument="prompt_template",
            ) from None
        return encode(tokenizer, text, add_special_tokens=False)
    return encode(tokenizer, prompt)


def _answer(
    lm: LanguageModel, tokenizer: Any, prompt: tuple[int, ...], answer: Any, gen_args: Any
) -> tuple[list[int], str]:
    """The answer's ids and text: as given, or generated greedily (a final EOS dropped)."""
    if answer is not None:
        if gen_args is not None:
            raise InvalidArgumentError(
                "gen_args apply only when the answer is generated (answer=None)",
                argument="gen_args",
            )
        if not isinstance(answer, str):
            raise InvalidTypeError(
                "answer must be a text, or None to generate it", argument="answer"
            )
        ids = encode(tokenizer, answer, add_special_tokens=False)
        if not ids or not answer.strip():
            raise EmptyTargetError("the answer is empty", argument="answer")
        return ids, answer
    if gen_args is not None and not isinstance(gen_args, dict):
        raise InvalidTypeError("gen_args must be a dict or None", argument="gen_args")
    args = dict(gen_args or CONTEXT_GEN_ARGS)
    new = args.get("max_new_tokens", CONTEXT_GEN_ARGS["max_new_tokens"])
    limit = lm.max_length
    if limit is not None and isinstance(new, int) and len(prompt) + new > limit:
        raise TargetTooLongError(
            f"the prompt has {len(prompt)} tokens and max_new_tokens is {new}: more than the "
            f"{limit} positions the model attends to; lower max_new_tokens",
            argument="gen_args",
        )
    eos = getattr(tokenizer, "eos_token_id", None)
    ids_in = torch.tensor([prompt], dtype=torch.long, device=lm.device)
    with torch.no_grad():
        out = [int(i) for i in lm.generate(ids_in, args, eos).reshape(-1).tolist()]
    if out and eos is not None and out[-1] == eos:
        out = out[:-1]
    text = tokenizer.decode(out) if out else ""
    if not out or not text.strip():
        raise EmptyTargetError(
            "the model generated no answer (only an end of sequence or white space); give the "
            "answer to attribute",
            argument="answer",
        )
    return out, text


def _token_ranges(
    tokenizer: Any, ids: list[int], text: str, spans: list[tuple[int, int]]
) -> list[tuple[int, int]]:
    """Each sentence's [start, stop) token range: from the token holding its first character to
    the one holding its last (ContextCite's selection; a token across two sentences counts in
    both). A token ends where its decoded prefix ends, carried into ``text`` where the decoding
    differs from it (a tokenizer that lowercases, or spaces its words apart)."""
    decoded = tokenizer.decode(ids)
    ends = [min(len(tokenizer.decode(ids[:k])), len(decoded)) for k in range(1, len(ids) + 1)]
    if decoded != text:
        carry = _carried(decoded, text)
        ends = [carry(e) for e in ends]
    ends[-1] = len(text)

    def token_at(c: int) -> int:
        return next((k for k, e in enumerate(ends) if c < e), len(ids) - 1)

    return [(token_at(a), token_at(b - 1) + 1) for a, b in spans]


def _carried(a: str, b: str) -> Callable[[int], int]:
    """A monotone map of character positions in ``a`` to positions in ``b``, the two compared
    without white space and case: exact inside the runs they share, linear across the gaps
    between them (an ``<unk>`` for a word); a position lands after a character of ``b``, and
    after any of ``b``'s characters that ``a`` lacks there (a "!" the tokenizer dropped)."""
    ka = [i for i, c in enumerate(a) if not c.isspace()]
    kb = [j for j, c in enumerate(b) if not c.isspace()]
    fold = difflib.SequenceMatcher(
        None, [a[i].casefold() for i in ka], [b[j].casefold() for j in kb], autojunk=False
    )
    xs, ys = [0], [0]  # runs' starts and ends, in characters that are not white space
    for i, j, n in fold.get_matching_blocks():  # the last is (len(ka), len(kb), 0)
        xs += [i, i + n]
        ys += [j, j + n]

    def carry(p: int) -> int:
        q = bisect.bisect_left(ka, p)
        k = bisect.bisect_right(xs, q) - 1
        if xs[k] == q or k + 1 == len(xs):
            r = ys[k]
        else:
            r = ys[k] + (q - xs[k]) * (ys[k + 1] - ys[k]) // (xs[k + 1] - xs[k])
        return kb[r - 1] + 1 if r else 0

    return carry


def _ranked(w: Tensor) -> list[int]:
    """Indices best first (ties by index)."""
    return sorted(range(int(w.numel())), key=lambda j: (-float(w[j]), j))


def ablation_masks(n: int, n_units: int, keep_prob: float, seed: int) -> np.ndarray:
    """[n, n_units] bool, True = kept: ablation ``i`` from ``RandomState(seed + i)``, as
    ContextCite draws them (so a seed gives its masks)."""
    out = np.zeros((n, n_units), dtype=bool)
    for i in range(n):
        rs = np.random.RandomState(seed + i)
        out[i] = rs.choice([False, True], size=n_units, p=[1 - keep_prob, keep_prob])
    return out


def _logit_prob(log_p: Tensor) -> Tensor:
    """log(p / (1 - p)) of a sequence's probability from its log-probability."""
    log_p = log_p.clamp(max=-1e-12)
    return log_p - torch.log(-torch.expm1(log_p))


def surrogate(x: Tensor, y: Tensor, counts: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """Per column of ``y`` [A, S], a Lasso from the masks ``x`` [A, U], as ContextCite fits it:
    columns of ``x`` standardised, ``y`` divided by the column's token count, weights and
    intercept scaled back. Weights [S, U], intercepts [S]."""
    mean = x.mean(0)
    std = x.std(0, unbiased=False)
    std = torch.where(std > 0, std, torch.ones_like(std))
    xs = ((x - mean) / std).expand(y.shape[1], -1, -1)
    ys = (y / counts).T
    coef, c0 = lasso(xs, ys, torch.ones_like(ys), alpha, max_iter=50_000, tol=1e-10)
    weights = coef / std * counts[:, None]
    bias = (c0 - (coef * (mean / std)).sum(1)) * counts
    return weights, bias


def held_out_r2(
    x: Tensor, y: Tensor, counts: Tensor, alpha: float, seed: int
) -> list[float | None]:
    """The R² on a held-out fifth of the ablations (drawn with ``seed``) of the surrogate fitted
    on the rest; None for a column whose held-out scores are all equal."""
    n = x.shape[0]
    held = max(2, round(HELD_OUT * n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test, train = order[:held], order[held:]
    w, b = surrogate(x[train], y[train], counts, alpha)
    pred = x[test] @ w.T + b  # [held, S]
    truth = y[test]
    res = ((truth - pred) ** 2).sum(0)
    tot = ((truth - truth.mean(0)) ** 2).sum(0)
    return [
        float(1 - r / s) if float(s) > 1e-12 * max(1.0, float(truth.abs().max())) else None
        for r, s in zip(res, tot, strict=True)
    ]
