"""``POST /v1/models/{model_id}/predictions``' bodies (CONTRACT §9.6): predictions for every
example, attributions only where ``explain_if`` holds."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from service.wire.attributions import AttributionRequest


class PredictionsRequest(AttributionRequest):
    """An attributions request whose examples are explained only where ``explain_if`` (a
    JMESPath expression over each example's prediction) is true."""

    method: str | None = Field(  # type: ignore[assignment]
        default=None,
        description="the method explaining the chosen examples (default: the model's default "
        "explanation, models.toml explain)",
    )
    explain_if: str | None = Field(
        default=None,
        description='JMESPath over each prediction {"label", "class", "probability", '
        '"output"}, as SageMaker Clarify\'s EnableExplanations: e.g. "probability < `0.6`" or '
        "\"label == 'fraud'\"; an example is explained where it is true (absent: none is)",
        max_length=2000,
    )


class Prediction(BaseModel):
    label: str | None = Field(description="the predicted class's label (null: a regression)")
    class_: int | None = Field(alias="class", description="the predicted class")
    probability: float | None = Field(
        description="its probability (a softmax; a multi-label model's own sigmoid)"
    )
    output: Any = Field(description="the model's whole output for the example")


class PredictionsResponse(BaseModel):
    model_id: str
    model_version: str
    method: str | None = Field(description="the method that explained (null: none ran)")
    explain_if: str | None
    predictions: list[Prediction]
    explanations: list[dict[str, Any] | None] = Field(
        description='per example: null, or {"attributions", "target"[, "tokens", '
        '"convergence_delta", "base_value"]} where explain_if held'
    )
    explained: int = Field(description="how many examples were explained")
    timing_ms: dict[str, float]
