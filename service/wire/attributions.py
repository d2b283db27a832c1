"""Request and response schemas of ``POST /v1/models/{model_id}/attributions``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from service.wire.checked import FidelityOut, SamplesOut, StepsOut, VerificationOut
from service.wire.schemas import (
    RESULT_NUMBERS,
    RESULT_OR_NULL,
    TENSOR_B64,
    TENSOR_LIST,
    Baselines,
    Inputs,
    Target,
)
from service.wire.schemas import result_schema as _result

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
    kind: Literal["heatmap", "overlay", "waterfall"] = Field(
        default="heatmap",
        description="images: the map alone, or blended over the input image; waterfall (a "
        "Shapley-family answer over tabular features or tokens): from the base value to the "
        "output feature by feature, as shap draws it",
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
    units: Literal["token", "word", "sentence", "paragraph"] | None = Field(
        default=None,
        description="text models, perturbation methods: what a text's features are, its "
        "tokens (default) or its words, sentences or paragraphs; the answer's units give each "
        "one's text and character offsets, its attributions one value per unit",
    )
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
            "shapley_value_sampling (over the permutations) and kernel_shap (over bootstrap "
            "resamples): the attributions' standard error, shaped as attributions (over a "
            "background set an upper bound)",
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
    samples: SamplesOut | None = Field(
        default=None,
        description='n_samples "auto": what it took (absent for a fixed n_samples)',
    )
    merged_requests: int = Field(default=1, description="requests merged into the engine call")
    timing_ms: TimingMs
