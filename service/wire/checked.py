"""What an attribution's checks measured, in its answer: against a float64 CPU copy
(``verify`` at the model's own dtype), against float32 (a lower ``precision``), and what
``n_steps: "auto"`` took to converge."""

from __future__ import annotations

from pydantic import BaseModel, Field


class VerificationOut(BaseModel):
    """The served attribution against the same attribution on a float64 CPU copy."""

    max_abs_diff: float = Field(description="max |served - reference| over the attributions")
    max_rel_diff: float = Field(description="max_abs_diff / max |reference|, per tensor")
    tolerance: float = Field(description="the served dtype's tolerance on max_rel_diff")
    reference: str = Field(description='"cpu-float64"')
    ok: bool = Field(description="max_rel_diff within the tolerance")


class FidelityOut(BaseModel):
    """The precision of an answer and what it cost (``methods.engine.precision.Fidelity``;
    CONTRACT 8.1)."""

    precision: str = Field(
        description="the precision of the returned numbers (float32 after a fallback; the "
        "model's dtype when no precision was asked)"
    )
    delta_ratio: list[float] | None = Field(
        default=None,
        description="per example, |convergence delta| / |f(x) - f(baseline)|, for methods with "
        "a delta (information only: rounding of f(x) and f(baseline) alone can make it large)",
    )
    checked: bool = Field(
        default=False,
        description="compared with a float32 computation (verify, a sampled check, or auto's "
        "probe)",
    )
    rel_l2: float | None = Field(
        default=None,
        description="when checked: ||a - a_float32|| / ||a_float32|| of the worst example",
    )
    topk_agreement: float | None = Field(
        default=None,
        description="when checked: the share of the worst example's top-k |attributions| "
        "(k = top_k, 10 or fewer features) that the float32 answer shares",
    )
    fallback: bool = Field(
        default=False,
        description="the low-precision answer failed the check: these are the float32 numbers",
    )
    tried: str | None = Field(
        default=None, description="with fallback: the precision tried and failed"
    )
    top_k: int | None = Field(default=None, description="the k of topk_agreement")
    tolerance: float = Field(description="the largest rel_l2 an answer may have")
    chosen: str | None = Field(
        default=None, description='precision "auto": what the probe measured and kept'
    )


class SamplesOut(BaseModel):
    """What ``n_samples: "auto"`` took."""

    n_samples: int = Field(description="the samples drawn (permutations, coalitions) in all")
    evaluations: int = Field(description="coalitions evaluated per example, every round counted")


class StepsOut(BaseModel):
    """What ``n_steps: "auto"`` took."""

    n_steps: int = Field(description="the rung it stopped at")
    evaluations: int = Field(
        description="forward/backward rows per example computed: the path's points (a nested "
        "rule computes each once) and the two endpoints' forwards"
    )
    error_estimate: float | None = Field(
        description="relative L2 change of the attributions between the last two rungs"
    )
