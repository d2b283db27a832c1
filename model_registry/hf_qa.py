"""A Hugging Face extractive question-answering model (``AutoModelForQuestionAnswering``:
BERT on SQuAD and its kin) served as a tensor model of token ids: a question and its context
in, three scores out, as Captum's BERT SQuAD tutorial attributes them.

The tutorial attributes "the largest start logit" and "the largest end logit" of the forward
at hand (``model(...).start_logits.max(1)``): the wrapper's output is ``[start, end, span]``
per example (span: their sum), so the targets ``"start"``, ``"end"`` and ``"span"`` are the
output's labels. Positions the batch pads are left out of the maxima (a batch answers as
each example alone). The answer itself (``answers``) is the best span of the context by
start plus end logit, as the Hugging Face pipeline picks it, at most ``MAX_ANSWER_TOKENS``
long, with its character offsets in the context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from model_registry.hf_text import PADDED, TextClassifier

#: the outputs' labels: what a target names
TARGETS = ("start", "end", "span")
#: the longest answer, in tokens (the Hugging Face pipeline's ``max_answer_len``)
MAX_ANSWER_TOKENS = 15


class QuestionAnswerer(TextClassifier):
    """``[max start logit, max end logit, their sum]`` per example from one tensor of ids
    (``PADDED`` where the batch pads)."""

    def logits(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The start and end logits, padded positions at -inf."""
        padded = ids == PADDED
        out = self.model(**self.encoded(ids))
        low = torch.finfo(out.start_logits.dtype).min
        return out.start_logits.masked_fill(padded, low), out.end_logits.masked_fill(padded, low)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        start, end = self.logits(ids)
        s, e = start.max(dim=1).values, end.max(dim=1).values
        return torch.stack([s, e, s + e], dim=1)


def answers(
    model: QuestionAnswerer, tokenizer: Any, ids: torch.Tensor, pairs: Sequence[Sequence[str]]
) -> list[dict[str, Any]]:
    """Each example's answer: ``{"text", "start", "end", "score", "tokens": [i, j]}`` (start
    and end: character offsets in the context; tokens: the span's first and last position),
    the context's best span by start plus end logit."""
    with torch.no_grad():
        start, end = model.logits(ids)
    out = []
    for row, (question, context) in enumerate(pairs):
        enc = tokenizer(question, context, truncation=False, return_offsets_mapping=True)
        segments = enc.sequence_ids() if hasattr(enc, "sequence_ids") else None
        offsets = enc.get("offset_mapping")
        n = len(enc["input_ids"])
        in_context = torch.tensor(
            [segments is not None and segments[i] == 1 for i in range(n)], dtype=torch.bool
        )
        if not bool(in_context.any()):  # no segment ids (a slow tokenizer): after the 1st [SEP]
            sep = [i for i, t in enumerate(enc["input_ids"]) if t == model.sep_id]
            lo, hi = (sep[0] + 1, sep[1] if len(sep) > 1 else n) if sep else (0, n)
            in_context[lo:hi] = True
        s, e = start[row, :n].double().cpu(), end[row, :n].double().cpu()
        scores = s[:, None] + e[None, :]
        i, j = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
        valid = (j >= i) & (j - i < MAX_ANSWER_TOKENS) & in_context[:, None] & in_context[None]
        scores = scores.masked_fill(~valid, float("-inf"))
        best = int(scores.flatten().argmax())
        first, last = divmod(best, n)
        if offsets is not None:
            a, b = int(offsets[first][0]), int(offsets[last][1])
            text = context[a:b]
        else:
            a, b = None, None
            text = tokenizer.decode(enc["input_ids"][first : last + 1]).strip()
        out.append({"text": text, "start": a, "end": b, "score": float(scores.flatten()[best]),
                    "tokens": [first, last]})  # fmt: skip
    return out
