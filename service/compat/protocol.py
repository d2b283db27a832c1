"""Schemas of the Open Inference Protocol v2 routes (``/v2/...``), as KServe, Triton and MLServer
define them, and of KServe's V1 ``:predict`` / ``:explain``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

#: a parameter value: OIP allows strings, numbers and booleans; attrserve's explain parameters
#: (params, target lists, render) may also be objects or lists
Parameters = dict[str, Any]


class RequestInput(BaseModel):
    name: str = Field(description="the model input's name (GET /v2/models/{id})")
    shape: list[int] = Field(description="the tensor's shape, batch dim first")
    datatype: str = Field(
        description="BOOL, UINT8..UINT64, INT8..INT64, FP16, BF16, FP32, "
        "FP64, or BYTES (raw texts, token models)"
    )
    parameters: Parameters | None = Field(
        default=None, description="binary_data_size: the tensor's bytes follow the JSON header"
    )
    data: Any = Field(default=None, description="the elements, flat or nested, row-major")


class RequestOutput(BaseModel):
    name: str
    parameters: Parameters | None = Field(
        default=None, description="binary_data: true returns this tensor as raw bytes"
    )


class InferenceRequest(BaseModel):
    """An OIP inference request. On ``/explain``, ``parameters`` name the method, ``target``,
    ``params`` and the other attribution options; inputs named ``baselines.<input>`` are the
    baselines."""

    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: list[Any] | None = Field(default=None, description="the elements, flat, row-major")


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: Parameters | None = None
    outputs: list[ResponseOutput]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 marks a free dim (dim 0: examples)")


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class LiveResponse(BaseModel):
    live: bool


class ReadyResponse(BaseModel):
    ready: bool


class ModelReadyResponse(BaseModel):
    name: str
    ready: bool


class V1Request(BaseModel):
    """KServe V1: ``instances`` (one entry per example: a nested list, a text or a pair, an
    encoded image ``{"image": "<base64>"}``, or an object keyed by input name) or ``inputs``
    (as the attributions route takes them). ``:explain`` also takes ``parameters``: the
    attributions request's fields (method, target, baselines, params, ...); without them the
    model's default explanation is used."""

    model_config = ConfigDict(extra="forbid")

    instances: list[Any] | None = None
    inputs: Any = None
    parameters: dict[str, Any] | None = None


class V1Predictions(BaseModel):
    predictions: list[Any] = Field(description="the model's output, one entry per example")


class Explanation(BaseModel):
    attributions: Any = Field(
        description="this example's attributions (a list per input on multi-input models)"
    )
    target: Any = None
    output: float | None = Field(default=None, description="the model's output at the target")
    convergence_delta: Any = None
    base_value: Any = Field(
        default=None,
        description="Shapley-family methods: the output at the baselines (attributions + "
        "base value = output where the method is exact)",
    )
    standard_error: Any = Field(
        default=None, description="sampled Shapley methods: the attributions' standard error"
    )
    tokens: list[str] | None = None


class V1Explanations(BaseModel):
    model_id: str
    model_version: str
    method: str
    params: dict[str, Any]
    predictions: list[Any] = Field(description="the model's output, one entry per example")
    explanations: list[Explanation]
    renders: list[Any] | None = None


class RepositoryIndexRequest(BaseModel):
    ready: bool = Field(default=False, description="list only the models ready now")


class RepositoryModel(BaseModel):
    name: str
    version: str
    state: str = Field(description="READY | LOADING | UNAVAILABLE (failed, or unloaded)")
    reason: str = Field(description='why it is not ready: the error, or "unloaded"')


class RepositoryLoadRequest(BaseModel):
    parameters: dict[str, Any] | None = Field(
        default=None, description="not taken: models.toml is the model's configuration"
    )


class RepositoryUnloadRequest(BaseModel):
    parameters: dict[str, Any] | None = Field(
        default=None, description="unload_dependents: accepted, nothing depends on a model"
    )
