"""What an attribution's checks measured, in its answer: against a float64 CPU copy
(``verify`` at the model's own dtype) and against float32 (a lower ``precision``)."""

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
    """What computing in a low precision cost (``methods.engine.precision.Fidelity``)."""

    precision: str = Field(description="the dtype the model ran in")
    delta_ratio: float | None = Field(
        default=None,
        description="max |convergence delta| / |f(x) - f(baseline)| over examples, for methods "
        "with a delta (rounding of f(x) and f(baseline) alone can make it large)",
    )
    relative_l2: float | None = Field(
        default=None, description="when verified: ||a - a_float32|| / ||a_float32||"
    )
    top_k_agreement: float | None = Field(
        default=None,
        description="when verified: the mean share of each example's top-k |attributions| "
        "that the float32 answer shares",
    )
    top_k: int | None = Field(default=None, description="the k of top_k_agreement")
    tolerance: float = Field(description="the largest relative_l2 an answer may have")
    verified: bool = Field(description="compared with a float32 computation")
    rerun_in_float32: bool = Field(
        description="the low-precision answer was out of tolerance: this is the float32 answer"
    )
    chosen: str | None = Field(
        default=None, description='precision "auto": what the probe measured and kept'
    )
