"""``/v1/models/{model_id}/monitor``'s bodies (CONTRACT §9.6)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.wire.attributions import Inputs


class JobReference(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job: str = Field(description="a finished attribution job of this model")


class InputsReference(BaseModel):
    """Rows attributed now, as an attributions request would (the target default: each
    row's predicted class)."""

    model_config = ConfigDict(extra="forbid")

    inputs: Inputs
    method: str | None = Field(default=None, description="default: the model's explanation")
    params: dict[str, Any] = Field(default_factory=dict)
    target: Any = None


class MonitorRequest(BaseModel):
    """An attribution drift monitor: a reference profile, and a live window of what the model
    serves from now on."""

    model_config = ConfigDict(extra="forbid")

    reference: JobReference | InputsReference
    agg: Literal["mean_abs", "mean_sq"] = Field(
        default="mean_abs", description="each feature's profile value over a label's examples"
    )
    sample: float = Field(
        default=1.0, gt=0, le=1, description="the share of served examples that join the window"
    )
    window: int = Field(default=1000, ge=1, le=1_000_000, description="the latest examples kept")
    ndcg_threshold: float = Field(
        default=0.9, gt=0, le=1, description="a label whose nDCG is below is a violation"
    )
    min_examples: int | None = Field(
        default=None, ge=1, description="examples before it judges (default: min(100, window))"
    )


class MonitorState(BaseModel):
    model_id: str
    status: Literal["warming_up", "ok", "violation"]
    examples: int = Field(description="examples in the live window")
    seen: int = Field(description="examples that joined since it started")
    ndcg: dict[str, float] = Field(description="per label: the live ranking against the reference")
    agg: str
    sample: float
    window: int
    ndcg_threshold: float
    min_examples: int
    features: list[str]
    reference: dict[str, Any]
    reference_source: dict[str, Any]
    live: dict[str, Any]
    started_at: float
