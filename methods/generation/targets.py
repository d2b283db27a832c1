"""What is attributed of a generated answer: a value per target token (a step), from the logits
the model gave at that step (``target_fn``), and the per-step score table.

- ``log_prob`` (Captum's): log p(y_t | prompt, y_<t);
- ``prob``: p(y_t | ...);
- ``logit``: the logit of y_t (before the softmax);
- ``entropy``: the entropy of the step's distribution (which features made the model sure);
- ``contrast``: why y_t *rather than* c_t: at each step, in the context the answer was
  written in (the prompt and y_<t), the ``contrast_fn`` value (``log_prob``, ``prob`` or
  ``logit``) of the target token minus that of the contrast answer's token at the same step
  (Yin and Neubig 2022; inseq's ``contrast_prob_diff`` with ``contrast_fn="prob"``,
  ``contrast_logits_diff`` with ``"logit"``). Steps pair as inseq pairs them by default
  (``align``): one to one from the end, so a contrast answer of the target's length pairs
  step by step.

A sequence's value is the sum of its steps' (``seq_attr`` attributes it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from methods.engine.precision import LOW_DTYPES
from methods.errors import InvalidArgumentError

TARGET_FNS = ("log_prob", "prob", "logit", "entropy", "contrast")
CONTRAST_FNS = ("log_prob", "prob", "logit")

#: logits [B, T, V] and the target ids [T] -> one value per row and step [B, T]
StepFn = Callable[[Tensor, Tensor], Tensor]


def wide(logits: Tensor) -> Tensor:
    """``logits`` in float32 when they are in a low dtype (``LOW_DTYPES``), as they are: a
    softmax over 50k logits in bfloat16 keeps 2-3 significant digits (a model served or run
    in a low ``precision``)."""
    return logits.float() if logits.dtype in LOW_DTYPES else logits


def _picked(values: Tensor, target: Tensor) -> Tensor:
    b, t = values.shape[0], values.shape[1]
    return values.gather(-1, target.to(values.device).expand(b, t).unsqueeze(-1)).squeeze(-1)


def log_prob(logits: Tensor, target: Tensor) -> Tensor:
    return _picked(torch.log_softmax(wide(logits), dim=-1), target)


def prob(logits: Tensor, target: Tensor) -> Tensor:
    return _picked(torch.softmax(wide(logits), dim=-1), target)


def logit(logits: Tensor, target: Tensor) -> Tensor:
    return _picked(wide(logits), target)


def entropy(logits: Tensor, target: Tensor) -> Tensor:
    logp = torch.log_softmax(wide(logits), dim=-1)
    return -(logp.exp() * logp).sum(-1)


STEP_FNS: dict[str, StepFn] = {
    "log_prob": log_prob,
    "prob": prob,
    "logit": logit,
    "entropy": entropy,
}


@dataclass
class Objective:
    """What a perturbed prompt is scored by: ``fn`` of the target's steps, less the same of
    the contrast answer's (``contrast``) for ``target_fn="contrast"``."""

    target: Tensor
    target_fn: str
    contrast_fn: str
    contrast: Tensor | None = None

    def step_fn(self) -> StepFn:
        """Logits [B, T, V] and the target [T] -> each step's value [B, T]."""
        if self.contrast is None:
            return STEP_FNS[self.target_fn]
        fn, contrast = STEP_FNS[self.contrast_fn], self.contrast

        def contrasted(logits: Tensor, target: Tensor) -> Tensor:
            return fn(logits, target) - fn(logits, contrast.to(logits.device))

        return contrasted

    def contrast_list(self) -> list[int] | None:
        return None if self.contrast is None else [int(i) for i in self.contrast.tolist()]


#: the per-step scores an answer may carry (``step_table``; CONTRACT 8.3)
STEP_SCORES = ("probability", "entropy", "rank")


def check_step_scores(names: object) -> tuple[str, ...] | None:
    """``step_scores``: a list of ``STEP_SCORES`` names (None: every one)."""
    if names is None:
        return None
    if not isinstance(names, (list, tuple)) or not all(
        isinstance(n, str) and n in STEP_SCORES for n in names
    ):
        raise InvalidArgumentError(
            f"step_scores must be a list of {list(STEP_SCORES)}, got {names!r}",
            argument="step_scores",
        )
    return tuple(dict.fromkeys(names))


def check(target_fn: object, contrast: object, contrast_fn: object) -> None:
    """``target_fn`` and its companions, named in the error when wrong."""
    if not isinstance(target_fn, str) or target_fn not in TARGET_FNS:
        raise InvalidArgumentError(
            f"target_fn must be one of {list(TARGET_FNS)}, got {target_fn!r}",
            argument="target_fn",
        )
    if not isinstance(contrast_fn, str) or contrast_fn not in CONTRAST_FNS:
        raise InvalidArgumentError(
            f"contrast_fn must be one of {list(CONTRAST_FNS)}, got {contrast_fn!r}",
            argument="contrast_fn",
        )
    if target_fn == "contrast" and contrast is None:
        raise InvalidArgumentError(
            "target_fn='contrast' compares the target with contrast_target: give it (the "
            "alternative answer's text or ids)",
            argument="contrast_target",
        )
    if target_fn != "contrast" and contrast is not None:
        raise InvalidArgumentError(
            f"contrast_target applies only to target_fn='contrast' (target_fn is {target_fn!r})",
            argument="contrast_target",
        )


def align(target: Tensor, contrast: Tensor, prefix: list[int] | tuple[int, ...]) -> Tensor:
    """The contrast token each target step is compared with: [T]. inseq 0.7.1's default
    (no alignments given): the sequences ``prefix + answer`` are aligned one to one from
    their ends, so an answer and a contrast of equal length pair step by step; a target step
    with no contrast token left takes the contrast sequence's position just before the end
    (inseq's fill) -- with a shorter contrast, a prompt token or the contrast's last."""
    full = [*prefix, *(int(i) for i in contrast.tolist())]
    t = int(target.numel())
    out = []
    for i in range(t):
        j = len(full) - (t - i)
        out.append(full[j] if j > 0 else full[-1])
    return torch.tensor(out, dtype=torch.long)


def step_table(logits: Tensor, target: Tensor) -> dict[str, list[float] | list[int]]:
    """The score table of the unperturbed answer, from its logits [T, V]: each target token's
    probability, the entropy of its step, and its rank among the vocabulary (0: the most
    likely, as CONTRACT 8.3 counts)."""
    logits = wide(logits.detach())
    logp = torch.log_softmax(logits, dim=-1)
    mine = logits.gather(-1, target.to(logits.device).unsqueeze(-1))
    return {
        "probability": logp.gather(-1, target.to(logits.device).unsqueeze(-1))
        .squeeze(-1)
        .exp()
        .tolist(),
        "entropy": (-(logp.exp() * logp).sum(-1)).tolist(),
        "rank": (logits > mine).sum(-1).tolist(),
    }
