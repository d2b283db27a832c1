"""``methods.stream_generation``: each answer token's attribution row as soon as it is known,
while the answer is written; then the whole result, equal to ``attribute_generation``'s.

Step ``t`` needs the answer's first ``t`` tokens and token ``t`` itself: given (``target``),
or the unperturbed prompt's most likely next token (greedy decoding; ``gen_args`` takes
``max_new_tokens`` only, and the answer stops after the end-of-sequence token).

- Perturbation methods: every perturbed prompt the method asks for is decoded on together with
  the others, one answer token per step, its key/value cache kept (prompts of one length share
  a batched forward); step ``t``'s row is the method run on each prompt's value at step ``t``,
  with one seed for every step (so the same coalitions), which is what the non-streamed
  attribution computes for that token. The whole answer costs what teacher forcing costs;
  the first row costs one step. Without a cache (a plain callable, or caches over the memory
  budget) each step runs the prompts whole.
- Gradient methods: step ``t``'s row is the token's own backward pass on the prompt and the
  first ``t`` answer tokens, as the non-streamed attribution computes each token's row.

An encoder-decoder's sources are encoded once and their decoders decode on their caches
(``Seq2SeqLanguageModel.begin`` and ``extend``); its generated answer is its own ``generate``'s
(forced tokens and the rest of its generation config), written before the first row.

``seq_attr`` comes at the end: the method on the sum of the steps' values (every prompt's
values are known by then: no forward), or the sum of the gradient rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods.api import attribute
from methods.cancel import checkpoint
from methods.engine.batching import memory_budget
from methods.errors import InvalidArgumentError
from methods.generation import gradient, targets
from methods.generation import precision as at_precision
from methods.generation.api import (
    GenerationResult,
    _given_ids,
    _pretty,
    _target_ids,
    contrast_steps,
    finish,
    prepare,
    token_features,
)
from methods.generation.catalog import PER_OUTPUT, PERTURBATION, check_length
from methods.generation.errors import TargetTooLongError
from methods.generation.features import Features
from methods.generation.lm import LanguageModel, Seq2SeqLanguageModel, _greedy_steps
from methods.generation.scorer import _sizes

Prompt = tuple[int, ...]


@dataclass(frozen=True)
class GenerationStep:
    """One answer token and its attribution row (what a stream sends per token)."""

    index: int
    token: str
    token_id: int
    #: the token's row of ``token_attr``: [n_features]
    attr: Tensor


@dataclass
class _Group:
    prompts: list[Prompt]
    #: keys and values kept (else the state is the ids, run whole at each step)
    cached: bool
    state: Any = None
    fed: int = 0  # answer tokens in the state
    logits: Tensor | None = None  # [B, V] of step ``fed``


@dataclass
class _Rows:
    """Prompts decoded on together; each prompt's value at every step so far."""

    lm: LanguageModel
    max_rows: int | None
    answer: list[int] = field(default_factory=list)  # the answer's tokens so far
    fns: list[Callable[[Tensor], Tensor]] = field(default_factory=list)  # per step: logits -> value
    groups: list[_Group] = field(default_factory=list)
    where: dict[Prompt, tuple[int, int]] = field(default_factory=dict)
    values: dict[Prompt, list[Tensor]] = field(default_factory=dict)
    held: int = 0  # bytes of the caches kept
    stats: dict[str, int] = field(default_factory=lambda: {"forwards": 0, "tokens_run": 0})

    def add(self, prompts: list[Prompt], steps: int) -> None:
        """Groups for the prompts not seen yet (``steps``: the answer's most tokens); a group
        keeps its caches while they fit the memory budget."""
        new = [q for q in dict.fromkeys(prompts) if q not in self.where]
        by_len: dict[int, list[Prompt]] = {}
        for q in new:
            if not q:
                raise InvalidArgumentError(
                    "a perturbed prompt has no tokens at all, so nothing predicts the first "
                    "target token; use non-empty baselines",
                    argument="baselines",
                )
            by_len.setdefault(len(q), []).append(q)
        vocab, _ = _sizes(self.lm)
        per_token, budget = _kv_bytes(self.lm), memory_budget(self.lm.device)
        for length, qs in by_len.items():
            row = (length + steps) * per_token
            cap = max(1, budget // max(1, row + vocab * 8))
            if self.max_rows is not None:
                cap = min(cap, self.max_rows)
            for s in range(0, len(qs), cap):
                part = qs[s : s + cap]
                caches = self.lm.caches or self.lm.seq2seq  # an encoder-decoder's decoder
                cached = caches and self.held + len(part) * row <= budget
                self.held += len(part) * row if cached else 0
                g = _Group(part, cached)
                for r, q in enumerate(part):
                    self.where[q] = (len(self.groups), r)
                    self.values[q] = []
                self.groups.append(g)

    def _record(self, g: _Group, step: int, logits: Tensor | None) -> None:
        """The group's values at ``step`` from that step's logits [B, V], where missing."""
        if logits is None or step >= len(self.fns):
            return
        need = [len(self.values[q]) == step for q in g.prompts]
        if any(need):
            for q, v, n in zip(g.prompts, self.fns[step](logits), need, strict=True):
                if n:
                    self.values[q].append(v)

    def _advance(self, g: _Group) -> None:
        """The group's state fed up to the answer so far, each step it passes recorded."""
        t = len(self.answer)
        if g.logits is not None and g.fed == t:
            return
        checkpoint()
        device = self.lm.device
        extend = type(self.lm).extend if g.cached else LanguageModel.extend
        if isinstance(self.lm, Seq2SeqLanguageModel) and (g.state is None or not g.cached):
            # sources encoded, the decoder fed the answer so far: every step's logits (its
            # cache kept for the next step where the memory budget allows, else run again)
            with torch.no_grad():
                logits, state = self.lm.begin(g.prompts, self.answer)
            state = state if g.cached else None
            first, run = 0, len(g.prompts) * (len(g.prompts[0]) + t + 1)
        else:
            if g.state is None:  # the prompts and the answer so far: every step's logits
                n = len(g.prompts[0])
                ids = torch.tensor([list(q) + self.answer for q in g.prompts], device=device)
                keep, first = n - 1, 0
            else:
                self._record(g, g.fed, g.logits)
                ids = torch.tensor([self.answer[g.fed : t]] * len(g.prompts), device=device)
                keep, first = 0, g.fed + 1
            with torch.no_grad():
                logits, state = extend(self.lm, g.state, ids, keep)
            run = int(ids.numel())
        for step in range(first, t):
            self._record(g, step, logits[:, step - first])
        self.stats["forwards"] += 1
        self.stats["tokens_run"] += run
        g.state, g.fed, g.logits = state, t, logits[:, -1]

    def next_logits(self, q: Prompt) -> Tensor:
        """The prompt's logits of the current step [V]."""
        gi, r = self.where[q]
        g = self.groups[gi]
        self._advance(g)
        if g.logits is None:
            raise RuntimeError("a group without logits")  # _advance always sets them
        return g.logits[r]

    def at(self, prompts: list[Prompt], fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Each prompt's value at the current step (``fn`` of its logits): [B]."""
        t = len(self.answer)
        if len(self.fns) == t:
            self.fns.append(fn)
        for q in dict.fromkeys(prompts):
            if len(self.values[q]) <= t:
                g = self.groups[self.where[q][0]]
                self._advance(g)
                self._record(g, t, g.logits)
        return torch.stack([self.values[q][t] for q in prompts])

    def total(self, prompts: list[Prompt]) -> Tensor:
        """Each prompt's values summed over the steps: [B]."""
        return torch.stack([torch.stack(self.values[q]).sum() for q in prompts])

    def feed(self, token: int) -> None:
        self.answer.append(token)


def _kv_bytes(lm: LanguageModel) -> int:
    """Bytes of keys and values one token keeps (a guess where the model does not say)."""
    cfg = getattr(lm.module, "config", None)
    layers = (
        getattr(cfg, "num_hidden_layers", None)
        or getattr(cfg, "n_layer", None)
        or len(getattr(lm.module, "blocks", ()) or ())
        or 12
    )
    _, width = _sizes(lm)
    itemsize = torch.finfo(lm.dtype).bits // 8 if lm.dtype.is_floating_point else 4
    return 2 * int(layers) * width * itemsize


def stream_generation(
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
    target_fn: str = "log_prob",
    contrast_target: str | Tensor | list[int] | None = None,
    contrast_fn: str = "log_prob",
    step_scores: list[str] | None = None,
    precision: str | None = None,
    **params: Any,
) -> Iterator[GenerationStep | GenerationResult]:
    """``attribute_generation``'s arguments; yields a ``GenerationStep`` per answer token as
    soon as its row is known, then the ``GenerationResult`` (the same as
    ``attribute_generation``'s, to rounding). Iterating drives the work: stop iterating and
    nothing more is computed. ``precision``: the model's copy in that dtype writes and
    attributes the answer, unchecked (``methods.generation.precision.for_stream``)."""
    for name in ("verify", "fidelity_tolerance"):
        if name in params:
            raise InvalidArgumentError(
                "a stream sends each row as soon as it is known, so it is not checked against "
                f"float32; leave {name} out, or use attribute_generation",
                argument=name,
            )
    run_on, low, fidelity = at_precision.for_stream(model, method, precision)
    steps = _stream(
        run_on, tokenizer, prompt, method, target, features, baselines, gen_args,
        skip_tokens=skip_tokens, seed=seed, perturbations_per_eval=perturbations_per_eval,
        internal_batch_size=internal_batch_size, use_cache=use_cache, target_fn=target_fn,
        contrast_target=contrast_target, contrast_fn=contrast_fn, step_scores=step_scores,
        **params,
    )  # fmt: skip
    yield from at_precision.in_dtype(steps, low, fidelity)


def _stream(
    model: Any,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    method: str,
    target: Any,
    features: Any,
    baselines: Any,
    gen_args: dict[str, Any] | None,
    *,
    skip_tokens: Any,
    seed: int | None,
    perturbations_per_eval: int | str | None,
    internal_batch_size: int | str | None,
    use_cache: bool,
    target_fn: str,
    contrast_target: Any,
    contrast_fn: str,
    step_scores: list[str] | None,
    **params: Any,
) -> Iterator[GenerationStep | GenerationResult]:
    shown = targets.check_step_scores(step_scores)
    lm, feats = prepare(
        model, tokenizer, prompt, method, features, baselines, skip_tokens, params,
        use_cache=use_cache, progress=False, target_fn=target_fn,
        contrast_target=contrast_target, contrast_fn=contrast_fn,
    )  # fmt: skip
    given: Tensor | None = None
    if target is not None:
        if gen_args is not None:
            raise InvalidArgumentError(
                "gen_args apply only when the target is generated (target=None)",
                argument="gen_args",
            )
        given = _given_ids(tokenizer, target, "target", lm.seq2seq)
        steps = int(given.numel())
    else:
        if gen_args is not None and not isinstance(gen_args, dict):
            raise InvalidArgumentError("gen_args must be a dict or None", argument="gen_args")
        steps = _greedy_steps(dict(gen_args or {}))
        if lm.seq2seq:
            # an encoder-decoder's answer is its own generate's (forced tokens and the other
            # rules of its generation config included): written first, attributed as it streams
            given = _target_ids(lm, tokenizer, feats, None, gen_args)
            steps = int(given.numel())
    generated = target is None
    contrast = None
    if contrast_target is not None:
        if given is None:
            raise InvalidArgumentError(
                "a streamed contrast needs the target given: its steps pair with the contrast "
                "answer's, whose length is known before the answer is written",
                argument="contrast_target",
            )
        contrast = contrast_steps(lm, feats, given, tokenizer, contrast_target)
    prompt_ids = feats.prompt_ids()
    limit = lm.max_length
    need = max(len(prompt_ids), steps) if lm.seq2seq else len(prompt_ids) + steps
    if limit is not None and need > limit:
        raise TargetTooLongError(
            f"the prompt has {len(prompt_ids)} tokens and the answer up to {steps}: more than "
            f"the {limit} positions the model attends to",
            argument="gen_args" if generated else "target",
        )
    eos = getattr(tokenizer, "eos_token_id", None) if given is None else None
    tokens = None if method in PERTURBATION else token_features(method, feats)
    s = seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item())
    rows: _Rows | None = None
    if method in PERTURBATION:
        rows = _Rows(
            lm, perturbations_per_eval if isinstance(perturbations_per_eval, int) else None
        )
        rows.add([prompt_ids], steps)
    greedy_state: list[Any] = [None, None]  # gradient methods' own decoding of the answer
    answer: list[int] = []
    token_rows: list[Tensor] = []
    echo: dict[str, Any] = {}
    ran = method
    for t in range(steps):
        if given is not None:
            y = int(given[t])
        elif rows is not None:
            y = int(rows.next_logits(prompt_ids).argmax())
        else:
            y = _greedy_next(lm, prompt_ids, answer, greedy_state)
        answer.append(y)
        ids = torch.tensor(answer, dtype=torch.long)
        part = None if contrast is None else contrast[: t + 1]
        objective = targets.Objective(ids, target_fn, contrast_fn, part)
        if rows is not None:
            row, echo = _perturbation_row(lm, feats, rows, objective, method, s, params, steps)
            rows.feed(y)
        elif tokens is not None:
            _, tok, ran, echo, _ = gradient.run(
                lm, tokens, objective, method, seed, internal_batch_size, params, steps=[t]
            )
            row = tok[0]
        else:
            raise RuntimeError("neither perturbed prompts nor token features")
        token_rows.append(row)
        yield GenerationStep(t, _pretty(tokenizer, [y])[0], y, row)
        if eos is not None and y == eos:
            break
    token_attr = torch.stack(token_rows)
    objective = targets.Objective(torch.tensor(answer), target_fn, contrast_fn, contrast)
    if rows is not None:
        seq = _perturbation_total(feats, rows, method, s, params)
        echo["perturbations_per_eval"] = (
            perturbations_per_eval if perturbations_per_eval is not None else "auto"
        )
        stats = {**rows.stats, "prompts": len(rows.where)}
    else:
        seq, stats = token_attr.sum(0), {"forwards": 0}
    echo["seed"] = seed
    echo["stream"] = True
    yield finish(
        lm, tokenizer, feats, objective, seq, token_attr, ran, echo, stats,
        use_cache=use_cache, gen_args=gen_args if generated else None, target=target,
        step_scores=shown,
    )  # fmt: skip


def _greedy_next(lm: LanguageModel, prompt: Prompt, answer: list[int], st: list[Any]) -> int:
    """The unperturbed prompt's next token after ``answer`` (state kept in ``st``)."""
    device = lm.device
    if st[0] is None:
        ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
    else:
        ids = torch.tensor([[answer[-1]]], dtype=torch.long, device=device)
    with torch.no_grad():
        logits, st[0] = lm.extend(st[0], ids, ids.shape[1] - 1)
    return int(logits[0, -1].argmax())


def _perturbation_row(
    lm: LanguageModel,
    feats: Features,
    rows: _Rows,
    objective: targets.Objective,
    method: str,
    seed: int,
    params: dict[str, Any],
    steps: int,
) -> tuple[Tensor, dict[str, Any]]:
    """The current step's row: the method on each prompt's value at this step."""
    t = len(rows.answer)
    c = objective.contrast
    one = targets.Objective(
        objective.target[t : t + 1],
        objective.target_fn,
        objective.contrast_fn,
        None if c is None else c[t : t + 1],
    )
    fn, y = one.step_fn(), one.target

    def at_step(logits: Tensor) -> Tensor:
        return fn(logits[:, None], y)[:, 0]

    def f(present: Tensor) -> Tensor:
        prompts = feats.ids(present == 1)
        check_length(lm, prompts, steps)
        rows.add(prompts, steps)
        return rows.at(prompts, at_step).to(present.device)[:, None]

    return _run_method(f, feats.n, method, seed, params, lm.dtype)


def _perturbation_total(
    feats: Features, rows: _Rows, method: str, seed: int, params: dict[str, Any]
) -> Tensor:
    def f(present: Tensor) -> Tensor:
        prompts = feats.ids(present == 1)
        return rows.total(prompts).to(present.device)[:, None]

    row, _ = _run_method(f, feats.n, method, seed, params, rows.lm.dtype)
    return row


def _run_method(
    f: Callable[[Tensor], Tensor],
    n: int,
    method: str,
    seed: int,
    params: dict[str, Any],
    dtype: torch.dtype,
) -> tuple[Tensor, dict[str, Any]]:
    ones = torch.ones(1, n, dtype=dtype)
    common: dict[str, Any] = {"baselines": 0, "perturbations_per_eval": 1 << 20, "seed": seed}
    if method in PER_OUTPUT:
        res = attribute(f, ones, method, **common, **params)
    else:
        res = attribute(f, ones, method, target=0, **common, **params)
    a = res.attributions
    if not isinstance(a, Tensor):
        raise TypeError("unexpected attribution form")  # one input: one tensor
    echo = {k: v for k, v in res.params.items() if k != "perturbations_per_eval"}
    return a.reshape(n).detach(), echo


__all__ = ["GenerationStep", "stream_generation"]
