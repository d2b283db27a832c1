"""A fixed target's value per step (its log-probability, or another ``targets`` function)
after each of many perturbed prompts, fast.

Captum runs one perturbed prompt at a time, one forward per target token. Here:

- every target token of a prompt comes from one teacher-forced forward over prompt + target
  (causal attention: position ``n - 1 + t`` sees exactly the prompt and the first ``t``
  target tokens, as token-by-token decoding does);
- prompts are batched: each row is right-padded after its target, so no row attends to
  padding (it comes later) and positions stay 0, 1, ... without masks or position ids;
- the answer's last token is never fed: nothing after it is scored;
- the key/value cache of a reference prompt (the unperturbed one, and the one with every
  feature absent) comes from the forward that scores that prompt, once per attribution, and
  only where the tokens it saves outweigh that forward; a perturbed prompt sharing its first
  ``p`` tokens with a reference runs only its remaining tokens on top of that cache. Rows
  are grouped into forwards by that shared depth, trading padding and lost sharing against
  the per-forward overhead;
- the unperturbed prompt's logits are kept, so the answer's score table needs no forward of
  its own (``logits_of``);
- distinct prompts are evaluated once (a memo keyed by token ids), so Shapley sampling's
  repeated coalitions, and the per-token fits of lime and kernel_shap, cost nothing more.

The result equals one plain forward per prompt to rounding (tests/methods/test_generation.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods import progress
from methods.cancel import checkpoint
from methods.engine.batching import memory_budget
from methods.errors import InvalidArgumentError
from methods.generation.lm import LanguageModel, Seq2SeqLanguageModel
from methods.generation.targets import StepFn, log_prob

#: the fixed cost of one forward (kernel launches, Python, the cache copy) counted in tokens,
#: by device type; grouping prompts into forwards weighs this against padding and lost prefix
#: sharing. On a GPU a forward is bound by its launches until thousands of tokens: GPT-2
#: small's took ~10 ms of Python on an H200 for 1200 tokens worth ~3 ms of GPU time, so
#: sharing prefixes there cost more forwards than the tokens they spared (feature ablation of
#: a 30-token prompt ran 4 forwards and cache copies where 2 do: 0.043 -> 0.019 s)
FORWARD_OVERHEAD_TOKENS = {"cpu": 48}
#: the same on any other device (a GPU); a rough figure: a model much larger than GPT-2 small
#: spends more per token, so its launches are worth fewer tokens and this merges a little more
#: than its best
ACCELERATOR_OVERHEAD_TOKENS = 1024

Prompt = tuple[int, ...]


@dataclass
class Stats:
    forwards: int = 0
    rows: int = 0
    tokens: int = 0
    max_rows: int = 0
    cached_tokens: int = 0


@dataclass
class Scorer:
    lm: LanguageModel
    target: Tensor  # 1-D target ids
    #: prompts whose prefix caches rows may reuse (the unperturbed and all-absent prompts)
    references: list[Prompt] = field(default_factory=list)
    use_cache: bool = True
    #: the most prompts per forward (None: as many as the memory budget allows)
    max_rows: int | None = None
    #: the value of each target step from its logits (``targets.STEP_FNS``)
    fn: StepFn = log_prob
    stats: Stats = field(default_factory=Stats)
    _memo: dict[Prompt, Tensor] = field(default_factory=dict)
    #: each reference's cache once built (None: the model gave none it can reuse)
    _caches: dict[int, Any] = field(default_factory=dict)
    #: the references' logits at the answer's steps [T, V]
    _logits: dict[Prompt, Tensor] = field(default_factory=dict)

    @property
    def t(self) -> int:
        return int(self.target.numel())

    def score(self, prompts: list[Prompt]) -> Tensor:
        """Each target step's value (``fn``: by default its log-probability) after each
        prompt: [B, T]."""
        todo = [q for q in dict.fromkeys(prompts) if q not in self._memo]
        if todo:
            self._compute(todo)
        return torch.stack([self._memo[q] for q in prompts])

    def logits_of(self, prompt: Prompt) -> Tensor | None:
        """The logits [T, V] at the answer's steps after a reference prompt, if scored."""
        return self._logits.get(prompt)

    # -- planning --------------------------------------------------------------------------

    def _usable(self, todo: list[Prompt], shared: dict[Prompt, list[int]]) -> list[int]:
        """The references whose caches these prompts run on: those built, and each other one
        whose prompts' saved tokens outweigh its own forward (free where the reference is
        among the prompts: it is scored by the forward that caches it). ``shared``: each
        prompt's reusable depth on each reference."""
        if not shared:
            return []
        usable = [r for r, c in self._caches.items() if c is not None]
        queued = set(todo)
        for r, ref in enumerate(self.references):
            if r in self._caches:
                continue
            gain = sum(
                max(0, d[r] - max((d[u] for u in usable), default=0)) for d in shared.values()
            )
            cost = len(ref) + self.t - 1 + self._overhead()
            if ref in queued or gain > cost:
                usable.append(r)
        return usable

    def _overhead(self) -> int:
        kind = self.lm.device.type
        return FORWARD_OVERHEAD_TOKENS.get(kind, ACCELERATOR_OVERHEAD_TOKENS)

    def _token_budget(self) -> int:
        itemsize = torch.finfo(self.lm.dtype).bits // 8 if self.lm.dtype.is_floating_point else 4
        vocab, width = _sizes(self.lm)
        # logits kept for ~T positions per row, plus ~16 activations of the model's width
        per_token = itemsize * (16 * width + vocab * 2)
        return max(1, memory_budget(self.lm.device) // per_token)

    def _plan(self, todo: list[Prompt]) -> list[tuple[int, int, list[Prompt]]]:
        """Forwards as (reference, depth, prompts)."""
        by_ref: dict[int, dict[int, list[Prompt]]] = {}
        depth: dict[Prompt, int] = {}
        shared: dict[Prompt, list[int]] = {}
        if self.use_cache and self.lm.caches:
            shared = {q: [_depth(q, ref) for ref in self.references] for q in todo}
        usable = self._usable(todo, shared)
        for q in todo:
            if not q:
                raise InvalidArgumentError(
                    "a perturbed prompt has no tokens at all, so nothing predicts the first "
                    "target token; use non-empty baselines (or a tokenizer that adds a "
                    "beginning-of-sequence token)",
                    argument="baselines",
                )
            found = [(u, shared[q][u]) for u in usable]
            r, depth[q] = max(found, key=lambda c: c[1], default=(-1, 0))
            if depth[q] <= 0:  # nothing shared: the prompt runs whole
                r, depth[q] = -1, 0
            by_ref.setdefault(r, {}).setdefault(depth[q], []).append(q)
        budget = self._token_budget()
        plan: list[tuple[int, int, list[Prompt]]] = []
        for r, groups in by_ref.items():
            depths = sorted(groups, reverse=True)
            rows = [groups[p] for p in depths]
            segments = _segments(depths, rows, self.t, budget, self.max_rows, self._overhead())
            for lo, hi in segments:
                chunk = [q for g in rows[lo:hi] for q in g]
                cap = self._cap(chunk, depths[hi - 1], budget)
                for s in range(0, len(chunk), cap):
                    part = chunk[s : s + cap]
                    plan.append((r, min(depth[q] for q in part), part))
        return plan

    def _cap(self, chunk: list[Prompt], p: int, budget: int) -> int:
        longest = max(len(q) for q in chunk) - p + self.t - 1
        cap = max(1, budget // max(1, longest))
        return min(cap, self.max_rows) if self.max_rows is not None else cap

    # -- evaluation ------------------------------------------------------------------------

    def _cache(self, r: int, queued: set[Prompt]) -> Any:
        """Reference ``r``'s cache, from the forward that also scores it (None: the model
        gave none this engine can reuse)."""
        if r not in self._caches:
            ref = self.references[r]
            ids = torch.tensor([list(ref) + self._fed()], dtype=torch.long, device=self.lm.device)
            logits, self._caches[r] = self.lm.prefix(ids, keep_from=len(ref) - 1)
            if ref not in self._memo:
                if ref not in queued:
                    progress.expect(1)
                self._store([ref], logits, 0, int(ids.shape[1]))
        return self._caches[r]

    def _fed(self) -> list[int]:
        """The answer's tokens a row runs after its prompt: all but the last."""
        return self.target.tolist()[:-1]

    def _compute(self, todo: list[Prompt]) -> None:
        device, t = self.lm.device, self.t
        target = self.target.to(device)
        tail, pad = self._fed(), int(self.target[-1])
        plan = self._plan(todo)
        queued = set(todo)
        progress.expect(sum(len(part) for _, _, part in plan))
        with torch.no_grad():
            for r, p, part in plan:
                checkpoint()
                if isinstance(self.lm, Seq2SeqLanguageModel):  # sources encoded whole, the
                    logits = self.lm.target_logits(part, target)  # answer decoded after each
                    self._store(part, logits, 0)
                    continue
                cache = self._cache(r, queued) if r >= 0 and p > 0 else None
                if cache is None:
                    p = 0
                part = [q for q in part if q not in self._memo]  # a reference, just scored
                if not part:
                    continue
                lengths = [len(q) - p for q in part]  # prompt tokens each row still runs
                width = max(lengths) + t - 1
                rows = [
                    list(q[p:]) + tail + [pad] * (width - n - t + 1)
                    for q, n in zip(part, lengths, strict=True)
                ]
                ids = torch.tensor(rows, dtype=torch.long, device=device)
                keep = min(lengths) - 1  # the first position whose logits are needed
                if cache is None:
                    logits = self.lm.logits(ids, keep_from=keep)
                else:
                    logits = self.lm.logits_after(cache, p, ids, keep_from=keep)
                start = torch.tensor(lengths, device=device) - 1 - keep
                pos = start[:, None] + torch.arange(t, device=device)[None]
                picked = logits[torch.arange(len(part), device=device)[:, None], pos]  # [B, T, V]
                self._store(part, picked, p, width)

    def _store(self, part: list[Prompt], logits: Tensor, p: int, width: int = 0) -> None:
        """One forward's values (from each row's logits at the answer's steps [B, T, V]),
        and its counts."""
        values = self.fn(logits, self.target.to(logits.device))
        refs = set(self.references)
        for q, v, lg in zip(part, values, logits, strict=True):
            self._memo[q] = v
            if q in refs:
                self._logits[q] = lg.clone()  # not a view holding the whole batch
        s = self.stats
        s.forwards += 1
        s.rows += len(part)
        s.tokens += len(part) * (width or max(len(q) for q in part) + self.t)
        s.cached_tokens += len(part) * p
        s.max_rows = max(s.max_rows, len(part))
        progress.done(len(part))


def _depth(q: Prompt, ref: Prompt) -> int:
    """The tokens of ``q`` a cache of ``ref`` spares it (at least one is left to run)."""
    return min(_shared(q, ref), len(q) - 1)


def _shared(a: Prompt, b: Prompt) -> int:
    """Length of the common prefix of two prompts."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
        min(len(a), len(b)),
    )


def _sizes(lm: LanguageModel) -> tuple[int, int]:
    """(vocabulary, hidden width) of the model, as far as it tells; generous guesses else."""
    cfg = getattr(lm.module, "config", None)
    vocab = getattr(cfg, "vocab_size", None) or getattr(lm.module, "vocab_size", None)
    width = (
        getattr(cfg, "hidden_size", None)
        or getattr(cfg, "n_embd", None)
        or getattr(lm.module, "width", None)
    )
    return int(vocab or 50_000), int(width or 1024)


def _segments(
    depths: list[int],
    rows: list[list[Prompt]],
    t: int,
    budget: int,
    max_rows: int | None,
    overhead: int,
) -> list[tuple[int, int]]:
    """Split groups (sorted by shared depth, deepest first) into consecutive runs, each run
    evaluated with the shallowest depth in it: least estimated work (tokens run plus
    ``overhead`` tokens per forward), by dynamic programming over the groups."""
    g = len(depths)
    longest = [max(len(q) for q in grp) for grp in rows]
    best = [0.0] + [float("inf")] * g
    cut = [0] * (g + 1)
    for hi in range(1, g + 1):
        n_rows, long_ = 0, 0
        for lo in range(hi - 1, -1, -1):
            n_rows += len(rows[lo])
            long_ = max(long_, longest[lo])
            width = long_ - depths[hi - 1] + t - 1
            cap = max(1, budget // max(1, width))
            if max_rows is not None:
                cap = min(cap, max_rows)
            forwards = -(-n_rows // cap)
            cost = best[lo] + forwards * overhead + n_rows * width
            if cost < best[hi]:
                best[hi], cut[hi] = cost, lo
    out = []
    hi = g
    while hi > 0:
        out.append((cut[hi], hi))
        hi = cut[hi]
    return out[::-1]
