"""Request and response schemas of ``POST /v1/models/{model_id}/attributions``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, WithJsonSchema

from service.wire.checked import FidelityOut, StepsOut, VerificationOut

#: The wire's schemas. Each is written out in full where it is used (pydantic's own schema of
#: these models stands alone); the OpenAPI document names each once, by its title, under
#: components/schemas (``service.http.openapi_doc``). Nothing here is validated by pydantic: the
#: codec checks tensors and targets against the model, with messages that say which.
#:
#: The shapes are what client generators digest (openapi-python-client, openapi-typescript,
#: openapi-generator's typescript-fetch; tests/service/test_generated_clients.py):
#: - unions are ``oneOf`` of arms that exclude each other (typescript-fetch collapses an
#:   ``anyOf`` of an array and an object into the object);
#: - nested lists are an array of numbers or arrays, any depth: a recursive schema would be
#:   exact, but neither openapi-python-client nor typescript-fetch can build one;
#: - openapi-python-client serializes a list by the union's first array arm, so that arm takes
#:   every kind of item; typescript-fetch types the items of an ``anyOf`` holding an object as
#:   that object, so lists of numbers (or class indices) get an arm of their own, which
#:   ``contains`` keeps apart from the first.
TENSOR_B64: dict[str, Any] = {
    "title": "TensorB64",
    "description": "A tensor as raw little-endian C-order bytes, base64.",
    "type": "object",
    "properties": {
        "dtype": {
            "type": "string",
            "description": "float16, float32, float64, int8, int16, int32, int64, uint8 or bool",
            "examples": ["float32"],
        },
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "b64": {"type": "string", "contentEncoding": "base64"},
    },
    "required": ["dtype", "shape", "b64"],
}
NESTED_NUMBERS: dict[str, Any] = {
    "title": "NestedNumbers",
    "description": "A tensor as nested lists of numbers, any depth (dim 0: the examples).",
    "type": "array",
    "items": {"anyOf": [{"type": "number"}, {"type": "array", "items": {}}]},
}
TENSOR: dict[str, Any] = {
    "title": "Tensor",
    "description": "A tensor: nested lists of numbers, or {dtype, shape, b64}.",
    "oneOf": [NESTED_NUMBERS, TENSOR_B64],
}
TENSOR_LIST: dict[str, Any] = {
    "title": "TensorList",
    "description": "One tensor per model input, in order (baselines: or a number), at least one "
    "of them {dtype, shape, b64}; nested lists alone are NestedNumbers.",
    "type": "array",
    "items": {"anyOf": [TENSOR_B64, {"type": "number"}, {"type": "array", "items": {}}]},
    "contains": TENSOR_B64,
}
BY_NAME: dict[str, Any] = {
    "title": "TensorsByName",
    "description": "One tensor per model input, keyed by the input's name.",
    "type": "object",
    # open-ended values: typescript-fetch cannot compile a map of unions. (It also sends any
    # object of a oneOf that is not a model as {}: its users give inputs as a list.)
    "additionalProperties": {"description": "a tensor: nested lists, or {dtype, shape, b64}"},
    # an object with b64 is one TensorB64; with background, a background set
    "not": {"anyOf": [{"required": ["b64"]}, {"required": ["background"]}]},
}
TEXTS: dict[str, Any] = {
    "title": "Texts",
    "description": "Raw texts, one per example (models with a tokenizer), or text pairs "
    '(["premise", "hypothesis"], models whose tokenizer encodes pairs: Hugging Face classifiers).',
    "type": "array",
    "items": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
        ]
    },
}
IMAGES: dict[str, Any] = {
    "title": "Images",
    "description": "Encoded images, one per example (models that take them: Hugging Face image "
    "classifiers), made into the model's pixel_values by its image processor.",
    "type": "array",
    "items": {
        "title": "EncodedImage",
        "type": "object",
        "properties": {
            "image": {
                "description": 'a PNG, JPEG or WebP file as base64 (a "data:image/...;base64," '
                "URL too)",
                "type": "string",
            }
        },
        "required": ["image"],
        "additionalProperties": False,
    },
}
TOP_K_TARGET: dict[str, Any] = {
    "title": "TopKTarget",
    "description": "Each example's K highest-scoring classes on the attributed scale, best "
    "first: the response's target is [[c1, ..., cK], ...] per example and attributions[i][k] "
    "is for target[i][k].",
    "type": "object",
    "properties": {"top_k": {"type": "integer", "minimum": 1}},
    "required": ["top_k"],
    "additionalProperties": False,
}
INDEX_TARGET: dict[str, Any] = {
    "title": "IndexTarget",
    "description": "An index into the output of one example (outputs of more than one dim).",
    "type": "object",
    "properties": {"index": {"type": "array", "items": {"type": "integer"}, "minItems": 1}},
    "required": ["index"],
    "additionalProperties": False,
}
RESULT_NUMBERS: dict[str, Any] = {
    "title": "ResultNumbers",
    "description": "A tensor as nested lists of numbers; null stands for NaN or an infinity, "
    "which JSON cannot carry.",
    "type": "array",
    "items": {"anyOf": [{"type": "number"}, {"type": "null"}, {"type": "array", "items": {}}]},
}
INPUTS: dict[str, Any] = {
    "title": "Inputs",
    "description": "One tensor, one tensor per model input (a list in order, or an object "
    "keyed by input name), (token models) raw texts, or (image classifiers) encoded images "
    '[{"image": "<base64>"}, ...]. Causal language models take an object '
    '{"prompt": "... {} ...", "features": ["slot value", ...], "baselines": [...], '
    '"skip_tokens": [...]} (features null: every prompt token is a feature).',
    # a list of nested lists is itself nested lists: the model's input count tells them apart
    "oneOf": [TENSOR_LIST, NESTED_NUMBERS, TENSOR_B64, BY_NAME, TEXTS, IMAGES],
}
TARGET: dict[str, Any] = {
    "title": "Target",
    "description": "A class index for all examples (3), one per example ([3, 1, 0]), an index "
    'into outputs of more than one dim ({"index": [2, 3]}) or one per example, a label name '
    'or one per example, "predicted" (each example\'s argmax), or null (models with one '
    'output per example), {"top_k": K} (each example\'s K best classes); causal language '
    "models: the answer's text, or null to generate it.",
    "oneOf": [
        {"type": "integer"},
        {"type": "string"},
        INDEX_TARGET,
        TOP_K_TARGET,
        {
            "type": "array",
            "items": {"anyOf": [INDEX_TARGET, {"type": "integer"}, {"type": "string"}]},
            "contains": INDEX_TARGET,
        },
        {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
        {"type": "null"},
    ],
}
BACKGROUND: dict[str, Any] = {
    "title": "Background",
    "description": "A background set: reference rows (each in one example's form; a tensor "
    "of rows, or one per model input as a list in order or an object keyed by input name). "
    "The answer is the mean of the method's answers with each row as the baseline "
    "(interventional Shapley values, as shap's Independent masker), weighted by weights "
    "(one per row, e.g. a K-means summary's cluster sizes) when given.",
    "type": "object",
    "properties": {
        "background": {"anyOf": [TENSOR_LIST, NESTED_NUMBERS, TENSOR_B64, BY_NAME]},
        "weights": {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
    },
    "required": ["background"],
    "additionalProperties": False,
}
BASELINES: dict[str, Any] = {
    "title": "Baselines",
    "description": "null (zeros, or the model's background set for the Shapley family), a "
    "number, a tensor, or one per model input (a list in order, or an object keyed by input "
    "name; each a number or a tensor), or a background set. A tensor's dim 0 may be 1 to "
    "broadcast.",
    "oneOf": [
        BACKGROUND,
        {"type": "number"},
        TENSOR_LIST,
        NESTED_NUMBERS,
        TENSOR_B64,
        BY_NAME,
        {"type": "null"},
    ],
}
#: named once each in the OpenAPI document
WIRE_SCHEMAS = (
    TENSOR_B64,
    NESTED_NUMBERS,
    TENSOR,
    TENSOR_LIST,
    BY_NAME,
    TEXTS,
    INDEX_TARGET,
    TOP_K_TARGET,
    BACKGROUND,
    RESULT_NUMBERS,
    INPUTS,
    TARGET,
    BASELINES,
)

RESULT_OR_NULL = (RESULT_NUMBERS, TENSOR_B64, {"type": "null"})

Inputs = Annotated[Any, WithJsonSchema(INPUTS)]
Target = Annotated[Any, WithJsonSchema(TARGET)]
Baselines = Annotated[Any, WithJsonSchema(BASELINES)]


def _result(description: str, *arms: dict[str, Any]) -> Any:
    """A response field's schema: one of ``arms``."""
    return WithJsonSchema({"description": description, "oneOf": list(arms)})


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


class InfidelityParams(BaseModel):
    """Infidelity (Yeh et al., 2019; Captum's): Gaussian noise I, inputs x - I."""

    model_config = ConfigDict(extra="forbid")

    noise_std: float = Field(default=0.003, ge=0, description="the noise's standard deviation")
    n_perturb_samples: int = Field(default=10, ge=1, description="noisy copies per example")
    normalize: bool = Field(default=False, description="scale the attributions as Captum does")
    max_examples_per_batch: int | None = Field(
        default=None, ge=1, description="examples per forward (null: all at once)"
    )


class SensitivityParams(BaseModel):
    """Max-sensitivity (Captum's): the method re-run on inputs with uniform noise."""

    model_config = ConfigDict(extra="forbid")

    perturb_radius: float = Field(default=0.02, ge=0, description="the noise's half-width")
    n_perturb_samples: int = Field(
        default=10, ge=1, description="re-runs of the method per example (each costs its rows)"
    )
    norm_ord: Literal["fro"] | float = Field(
        default="fro", description="'fro' or a vector norm's order"
    )
    max_examples_per_batch: int | None = Field(
        default=None, ge=1, description="examples per re-run (null: all at once)"
    )


class CurveParams(BaseModel):
    """Deletion or insertion (Petsiuk et al., 2018): features replaced by the baselines (or
    taken from the input), most important first, in ``steps`` steps."""

    model_config = ConfigDict(extra="forbid")

    steps: int = Field(default=20, ge=1, description="steps: the curve has steps + 1 points")
    max_examples_per_batch: int | None = Field(
        default=None, ge=1, description="rows per forward (null: every step at once)"
    )


class MetricsRequest(BaseModel):
    """Scores of the attributions, computed in the same call, their cost counted in the
    request's ({} takes a metric's defaults). The noise is seeded by the request's seed (0
    when none): the same request gives the same numbers. deletion and insertion fill with the
    request's baselines (0 when none; a distribution's mean row) and group features by
    params.feature_mask when the method has one. A max_examples_per_batch left unset is the
    request's internal_batch_size (rows per forward)."""

    model_config = ConfigDict(extra="forbid")

    infidelity: InfidelityParams | None = None
    sensitivity_max: SensitivityParams | None = None
    deletion: CurveParams | None = None
    insertion: CurveParams | None = None

    def asked(self) -> dict[str, dict[str, Any]]:
        """The metrics asked for, with every parameter."""
        return {
            name: value.model_dump()
            for name in type(self).model_fields
            if (value := getattr(self, name)) is not None
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
        default="all",
        description="which scores to show: all, signed (diverging colours: red positive, blue "
        "negative, as the explorer draws), or |a| (grey), a > 0, a < 0",
    )
    colormap: str | None = Field(
        default=None, description="a colormap name; default by sign (diverging for 'all')"
    )
    examples: list[int] | None = Field(
        default=None, description="which examples to draw (indices); default all"
    )
    width: int | None = Field(
        default=480,
        ge=64,
        le=2048,
        description="PNG pictures: the width in pixels (null: the picture's own size, one "
        "pixel per input pixel on images)",
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
    precision: Literal["float32", "bfloat16", "float16", "auto"] | None = Field(
        default=None,
        description="run the model's forward and backward in this dtype, the engine's sums in "
        "float32; the answer's fidelity says what it cost; auto: the fastest precision that "
        "passed the model's probe; default the model's precision (models.toml), else its dtype",
    )
    verify: bool = Field(
        default=False,
        description="with a precision other than the model's dtype: also compute in float32 "
        "and compare (fidelity), answering float32 when out of tolerance; otherwise: also "
        "compute on a float64 CPU copy of the model and return how far the served one is from "
        "it (verification; tensor models, deterministic methods); a stream is not checked",
    )
    metrics: MetricsRequest | None = Field(
        default=None, description="also score the attributions (the response gains metrics)"
    )
    output: Literal["raw", "probability", "log_probability", "log_odds"] = Field(
        default="raw",
        description="the scale attributed, and of outputs: the model's raw output, or its "
        "probabilities (softmax over classes; a sigmoid for a single logit), log-probabilities "
        "or log-odds (shap's link, Clarify's UseLogit)",
    )


#: the request's fields other than the method and its params: where a Captum user's engine
#: argument (``target``, ``baselines``, ``internal_batch_size``, ...) goes; the one list the
#: service reads (params checks, error locations, KServe/OIP ``parameters``)
REQUEST_FIELDS: frozenset[str] = frozenset(AttributionRequest.model_fields) - {"method", "params"}


class TimingMs(BaseModel):
    queue: float
    compute: float
    total: float
    metrics: float | None = Field(
        default=None, description="of compute: the metrics' part, when they were asked for"
    )


class Render(BaseModel):
    example: int = Field(description="the example drawn (index into the batch)")
    input: str | None = Field(default=None, description="multi-input models: the input drawn")
    layer: str | None = Field(
        default=None, description="a list of layers (params.layer): the layer drawn"
    )
    media_type: Literal["image/png", "text/html"]
    b64: str = Field(description="the file's bytes, base64")


class Curve(BaseModel):
    """A deletion or insertion curve per example: the targeted output after each step."""

    auc: list[float | None] = Field(description="the area under the curve, per example")
    curve: list[list[float | None]] = Field(description="steps + 1 values per example")


class MetricsOut(BaseModel):
    """The metrics asked for, per example (null stands for NaN)."""

    infidelity: list[float | None] | None = None
    sensitivity_max: list[float | None] | None = None
    deletion: Curve | None = None
    insertion: Curve | None = None


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
    attributions: Annotated[
        Any,
        _result(
            "a tensor, or one per model input (multi-input models), or one per layer when "
            "params.layer is a list",
            TENSOR_LIST,
            RESULT_NUMBERS,
            TENSOR_B64,
        ),
    ]
    convergence_delta: Annotated[
        Any, _result("per example, when return_convergence_delta was set", *RESULT_OR_NULL)
    ] = None
    target: list[Any] | None = Field(description="the resolved target, one per example")
    outputs: Annotated[
        Any, _result("the model's output at the target, per example", *RESULT_OR_NULL)
    ]
    base_values: Annotated[
        Any,
        _result(
            "Shapley-family methods: the output at the baselines (their mean over a "
            "background set), per example: attributions + base value = output where the method "
            "is exact",
            *RESULT_OR_NULL,
        ),
    ] = None
    standard_error: Annotated[
        Any,
        _result(
            "shapley_value_sampling: the attributions' standard error over the permutations, "
            "shaped as attributions (over a background set an upper bound)",
            TENSOR_LIST,
            RESULT_NUMBERS,
            TENSOR_B64,
            {"type": "null"},
        ),
    ] = None
    tokens: list[list[str]] | None = Field(default=None, description="raw-text inputs: the tokens")
    input_tokens: list[str] | None = Field(
        default=None,
        description="causal LMs: the prompt's features (its tokens, or the template's slot values)",
    )
    output_tokens: list[str] | None = Field(
        default=None, description="causal LMs: the tokens of the answer attributed"
    )
    seq_attr: list[float] | None = Field(
        default=None, description="causal LMs: one score per feature for the whole answer"
    )
    token_attr: list[list[float]] | None = Field(
        default=None, description="causal LMs: one row of scores per answer token"
    )
    step_scores: dict[str, list[int] | list[float]] | None = Field(
        default=None,
        description="causal LMs: the answer's steps after the whole prompt: probability, "
        "log_prob, entropy and rank (0: the most likely token) of each answer token; "
        "params.step_scores (a list of probability, entropy, rank) keeps only those",
    )
    params: dict[str, Any] = Field(description="every effective parameter")
    renders: list[Render] | None = Field(
        default=None, description="pictures of the attributions, when render was asked for"
    )
    verification: VerificationOut | None = Field(
        default=None, description='when "verify" was set: the distance from cpu-float64'
    )
    metrics: MetricsOut | None = Field(
        default=None, description='when "metrics" was asked for: the scores'
    )
    fidelity: FidelityOut | None = Field(
        default=None,
        description="the precision of the numbers and what it cost (every answer)",
    )
    steps: StepsOut | None = Field(
        default=None, description='n_steps "auto": what it took (absent for a fixed n_steps)'
    )
    merged_requests: int = Field(default=1, description="requests merged into the engine call")
    timing_ms: TimingMs
