"""Request and response schemas of a model's influence routes (CONTRACT 7.4)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from service.wire.schemas import Inputs, Target


class InfluenceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Inputs = Field(description="the test examples, in any form the attributions take")
    labels: Target = Field(
        None,
        description="each example's label for the loss: a class index or label name (per "
        "request or per example), or a tensor for mse / bce_with_logits; null: the model's "
        "predicted class",
    )
    target: Target = Field(None, description="the same as labels (either may be given)")
    k: int = Field(5, ge=1, description="training examples per test example")
    opponents: bool = Field(False, description="also the k most opposing training examples")
    include_examples: bool = Field(
        False,
        description="each listed training example also carries its inputs and label "
        "(examples), to be shown beside the prediction",
    )
    deadline_ms: float | None = Field(None, gt=0, description="deadline in ms")


class TrainingExample(BaseModel):
    index: int = Field(description="its row in train_data")
    inputs: Any = Field(description="its inputs as the model takes them (one per input)")
    label: Any = Field(description="its label in train_data")
    label_name: str | None = Field(None, description="the label's name, where the model has them")


class TopK(BaseModel):
    indices: list[int] = Field(description="training examples (row indices of train_data)")
    scores: list[float]
    examples: list[TrainingExample] | None = Field(
        None, description="with include_examples: the listed examples themselves, in order"
    )


class InfluenceResponse(BaseModel):
    model_id: str
    model_version: str
    method: str = Field(description="the index's method (models.toml influence.method)")
    proponents: list[TopK] = Field(description="one per test example, highest influence first")
    opponents: list[TopK] | None = Field(
        default=None, description="with opponents: one per test example, most negative first"
    )
    timing_ms: dict[str, float]


class SelfInfluence(BaseModel):
    model_id: str
    method: str
    indices: list[int] = Field(
        description="the training examples of highest self-influence, first the highest "
        "(likely mislabeled or atypical)"
    )
    scores: list[float]
    examples: list[TrainingExample] | None = Field(
        None, description="with include_examples: the listed examples themselves, in order"
    )


def per_example(found: dict[str, Any]) -> list[dict[str, Any]]:
    """``{"indices": [[...]], "scores": [[...]]}`` as one ``TopK`` per example."""
    return [
        {"indices": i, "scores": s} for i, s in zip(found["indices"], found["scores"], strict=True)
    ]
