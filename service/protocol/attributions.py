"""Request and response schemas of ``POST /v1/models/{model_id}/attributions``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, WithJsonSchema

TENSOR = {
    "description": "A tensor: a nested JSON list, or {dtype, shape, b64} (raw little-endian "
    "C-order bytes, base64).",
    "anyOf": [
        {"type": "array", "items": {}},
        {
            "type": "object",
            "properties": {
                "dtype": {"type": "string", "example": "float32"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "b64": {"type": "string"},
            },
            "required": ["dtype", "shape", "b64"],
        },
    ],
}

Inputs = Annotated[
    Any,
    WithJsonSchema(
        {
            "description": "One tensor, a list of tensors (one per model input, in order), an "
            "object keyed by input name, or (token models) a list of raw texts.",
            "anyOf": [
                TENSOR,
                {"type": "object", "additionalProperties": TENSOR},
                {"type": "array", "items": {"type": "string"}},
            ],
        }
    ),
]
Target = Annotated[
    Any,
    WithJsonSchema(
        {
            "description": "A class index for all examples (3), one per example ([3, 1, 0]), "
            'an index tuple ({"index": [2, 3]}) or a list of them, a label name or a list of '
            "label names, "
            '"predicted" (each example\'s argmax), or null for scalar-output models.',
        }
    ),
]
Baselines = Annotated[
    Any,
    WithJsonSchema(
        {
            "description": "null (zeros), a number, a tensor, or one per input (list or by name). "
            "A tensor's dim 0 may be 1 to broadcast.",
        }
    ),
]
BatchSize = Annotated[
    int | Literal["auto"] | None,
    Field(description="rows per forward: an int, 'auto' (memory budget), or null (default)"),
]

EXAMPLES: dict[str, dict[str, Any]] = {
    "tabular_ig": {
        "summary": "Integrated gradients on tabular-mlp",
        "value": {
            "method": "integrated_gradients",
            "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
            "target": 1,
            "params": {"n_steps": 50, "approximation_method": "gausslegendre"},
            "return_convergence_delta": True,
        },
    },
    "tabular_saliency_predicted": {
        "summary": "Saliency at each example's predicted class, base64 output",
        "value": {
            "method": "saliency",
            "inputs": [[1.0, 0, 0, 0.5, 0, 0, 0, 0], [-1.0, 0, 0, -0.5, 0, 0, 0, 0]],
            "target": "predicted",
            "output_encoding": "base64",
        },
    },
    "text_ig": {
        "summary": "Raw text on text-classifier (attributed at the embedding layer)",
        "value": {
            "method": "integrated_gradients",
            "inputs": ["a wonderful film", "a dull plot"],
            "target": "positive",
        },
    },
    "image_occlusion": {
        "summary": "Occlusion on image-cnn with a base64 input",
        "value": {
            "method": "occlusion",
            "inputs": {"dtype": "float32", "shape": [1, 3, 32, 32], "b64": "<12288 bytes>"},
            "target": 0,
            "params": {"sliding_window_shapes": [3, 8, 8], "strides": [3, 8, 8]},
        },
    },
}


class RenderSpec(BaseModel):
    """A picture of the attributions: images as a heatmap or an overlay on the input, texts as
    highlighted tokens, tabular rows as a bar chart of the features."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["png", "html"] = Field(default="png", description="image/png or text/html")
    kind: Literal["heatmap", "overlay"] = Field(
        default="heatmap", description="images: the map alone, or blended over the input image"
    )
    sign: Literal["absolute", "positive", "negative", "all"] = Field(
        default="absolute",
        description="which scores to show: |a|, a > 0, a < 0, or all (diverging colours)",
    )
    colormap: str | None = Field(
        default=None, description="a colormap name; default by sign (diverging for 'all')"
    )
    examples: list[int] | None = Field(
        default=None, description="which examples to draw (indices); default all"
    )
    #: set by the route when the Accept header asks for the picture itself (one, then)
    _single: bool = PrivateAttr(default=False)


class AttributionRequest(BaseModel):
    """Attribute a model's targeted output to its inputs with one registered method."""

    model_config = ConfigDict(extra="forbid")

    method: str = Field(description="registry name of the method (GET /v1/methods)")
    inputs: Inputs
    target: Target = None
    baselines: Baselines = None
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="method parameters (Captum's names; see GET /v1/methods)",
    )
    internal_batch_size: BatchSize = None
    perturbations_per_eval: BatchSize = None
    noise_tunnel: dict[str, Any] | None = Field(
        default=None,
        description="wrap the method in SmoothGrad/VarGrad: {nt_type, nt_samples, stdevs}",
    )
    seed: int | None = Field(default=None, description="seed for stochastic methods (reproducible)")
    return_convergence_delta: bool = Field(default=False, description="also return the delta")
    output_encoding: Literal["json", "base64"] = Field(
        default="json", description="tensor encoding"
    )
    deadline_ms: float | None = Field(
        default=None,
        gt=0,
        description="abandon the request after this long (504); default a setting",
    )
    render: RenderSpec | None = Field(
        default=None,
        description="also draw the attributions (the response gains renders); with Accept: "
        "image/png or text/html and one example, the response is the picture itself",
    )


class TimingMs(BaseModel):
    queue: float
    compute: float
    total: float


class Render(BaseModel):
    example: int = Field(description="the example drawn (index into the batch)")
    input: str | None = Field(default=None, description="multi-input models: the input drawn")
    media_type: Literal["image/png", "text/html"]
    b64: str = Field(description="the file's bytes, base64")


class AttributionResponse(BaseModel):
    """Attributions mirroring the inputs (per-token scores for token models)."""

    model_id: str
    model_version: str
    method: str = Field(description="the method that ran (a layer method on token models)")
    requested_method: str | None = Field(
        default=None, description="set when the method was rewritten"
    )
    attributed_layer: str | None = Field(
        default=None,
        description="token models: the embedding layer attributed (summed over its dim)",
    )
    attributions: Any = Field(description="a tensor, or a list of tensors (multi-input models)")
    convergence_delta: Any = None
    target: list[Any] | None = Field(description="the resolved target, one per example")
    outputs: Any = Field(description="the model's output at the target, per example")
    tokens: list[list[str]] | None = Field(default=None, description="raw-text inputs: the tokens")
    params: dict[str, Any] = Field(description="every effective parameter")
    renders: list[Render] | None = Field(
        default=None, description="pictures of the attributions, when render was asked for"
    )
    merged_requests: int = Field(default=1, description="requests merged into the engine call")
    timing_ms: TimingMs
