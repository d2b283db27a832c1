"""``POST /v1/models/{model_id}/dependence``' bodies (CONTRACT §9.6)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.wire.attributions import Inputs


class DependenceRequest(BaseModel):
    """Partial dependence and ICE curves of a tabular model over the rows given."""

    model_config = ConfigDict(extra="forbid")

    inputs: Inputs
    features: list[int] = Field(min_length=1, description="the features (columns) to sweep")
    grid_resolution: int = Field(
        default=15, gt=1, le=1000, description="points of each feature's grid (at most)"
    )
    percentiles: tuple[float, float] = Field(
        default=(0.05, 0.95),
        description="the grid's ends: these percentiles of the rows' values (as scikit-learn)",
    )
    kind: Literal["average", "individual", "both"] = Field(
        default="average",
        description="average: partial dependence; individual: each row's ICE curve; both",
    )
    target: int | str | None = Field(
        default=None, description="the output followed: a class (int or label); none for one output"
    )
    output: Literal["raw", "probability", "log_probability", "log_odds"] = Field(
        default="raw", description="the scale of the output followed"
    )
    render: bool = Field(default=False, description="also draw each feature's curves (PNG)")
    deadline_ms: float | None = Field(default=None, gt=0, description="abandon after this long")


class FeatureCurves(BaseModel):
    feature: int
    name: str | None = Field(default=None, description="the feature's name, where declared")
    grid: list[float]
    average: list[float] | None = Field(description="the mean over the rows at each grid value")
    individual: list[list[float]] | None = Field(description="each row's curve (ICE)")


class DependenceResponse(BaseModel):
    model_id: str
    model_version: str
    target: int | None
    output: str
    features: list[FeatureCurves]
    renders: list[dict[str, Any]] | None = None
    timing_ms: dict[str, float]
