"""What is attributed: the model's raw output, or its probabilities, log-probabilities or
log-odds (shap's ``link``, Clarify's ``UseLogit``), computed from the raw output in the
forward, so every method attributes the scale asked and reports ``outputs`` in it.

Over the last dim: a softmax where it has more than one entry, a sigmoid for a single logit
(an output of shape (N,) or (N, 1)) or wherever ``independent`` (multi-label models: each
label its own sigmoid). Log-odds are ``log p - log(1 - p)``, computed from the log-probability
without rounding a probability near 1 to 1: for a single logit they are the logit itself.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from methods.errors import InvalidArgumentError

Scale = Literal["raw", "probability", "log_probability", "log_odds"]
SCALES: tuple[Scale, ...] = ("raw", "probability", "log_probability", "log_odds")


def check_scale(output: object) -> Scale:
    if output is None:
        return "raw"
    if output not in SCALES:
        raise InvalidArgumentError(
            f"output must be one of {list(SCALES)}, got {output!r}", argument="output"
        )
    return output


def scaled(out: Tensor, output: Scale, independent: bool = False) -> Tensor:
    """``out`` (raw scores, classes on the last dim) on the ``output`` scale."""
    if output == "raw":
        return out
    if not out.is_floating_point():
        out = out.to(torch.get_default_dtype())
    single = out.dim() <= 1 or out.shape[-1] == 1
    if single or independent:
        if output == "probability":
            return torch.sigmoid(out)
        if output == "log_probability":
            return torch.nn.functional.logsigmoid(out)
        return out  # log(sigmoid(z) / (1 - sigmoid(z))) == z
    log_p = torch.log_softmax(out, dim=-1)
    if output == "probability":
        return log_p.exp()
    if output == "log_probability":
        return log_p
    return log_p - _log1m_exp(log_p)


def _log1m_exp(a: Tensor) -> Tensor:
    """log(1 - exp(a)) for a <= 0, accurately on both sides of -log 2 (Maechler 2012)."""
    return torch.where(a > -math.log(2.0), torch.log(-torch.expm1(a)), torch.log1p(-torch.exp(a)))
