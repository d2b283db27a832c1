"""Request and response schemas of ``POST /v1/models/{model_id}/attacks`` and
``.../counterfactuals`` (CONTRACT 7.2): the attributions body's shape, with ``method`` (an
attack) or ``perturbation`` (a counterfactual search) and that one's ``params`` (Python's
keyword arguments, Captum's names)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from methods.robustness.attack import BOUNDS, PARAMS
from methods.robustness.minimal import OWN_PARAMS, SEARCH
from service.wire.attributions import TimingMs
from service.wire.schemas import RESULT_NUMBERS, TENSOR_B64, TENSOR_LIST, Inputs, Target
from service.wire.schemas import result_schema as _result

ATTACK_EXAMPLES: dict[str, dict[str, Any]] = {
    "tabular_fgsm": {
        "summary": "FGSM on tabular-mlp, at each example's predicted class",
        "value": {
            "method": "fgsm",
            "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
            "params": {"epsilon": 0.3, "loss": "cross_entropy"},
        },
    },
    "image_pgd": {
        "summary": "PGD (Linf) on image-cnn within [0, 1], with the pictures",
        "value": {
            "method": "pgd",
            "inputs": {"dtype": "float32", "shape": [1, 3, 32, 32], "b64": "<12288 bytes>"},
            "target": 0,
            "params": {
                "radius": 0.05,
                "step_size": 0.01,
                "step_num": 10,
                "lower_bound": 0,
                "upper_bound": 1,
                "loss": "cross_entropy",
            },
            "render": {},
        },
    },
}
COUNTERFACTUAL_EXAMPLES: dict[str, dict[str, Any]] = {
    "tabular_ablation": {
        "summary": "How many of tabular-mlp's features, most important first, must go",
        "value": {
            "perturbation": "feature_ablation",
            "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
            "params": {"arg_min": 0, "arg_max": 9, "arg_step": 1},
        },
    },
    "tabular_noise": {
        "summary": "The least Gaussian noise that changes tabular-mlp's answer (binary search)",
        "value": {
            "perturbation": "gaussian_noise",
            "inputs": [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]],
            "params": {"arg_min": 0, "arg_max": 4, "arg_step": 0.05, "mode": "binary"},
            "seed": 1,
        },
    },
}
TARGET_NOTE = (
    ' Default "predicted": each example\'s class now, the decision to change (or, with '
    "params.targeted, the class to reach)."
)


def _params_schema(names: list[str]) -> dict[str, Any]:
    """The JSON schema of a params object: its keys, each number with its range (``BOUNDS``,
    the engine's own checks); the description lists what each key means and when it applies."""
    props: dict[str, Any] = {}
    for name in dict.fromkeys(names):
        node: dict[str, Any] = {}
        if name in BOUNDS:
            op, bound = BOUNDS[name]
            node = {
                "type": "integer" if name == "step_num" else "number",
                ("minimum" if op == ">=" else "exclusiveMinimum"): bound,
            }
        props[name] = node
    return {"type": "object", "properties": props, "additionalProperties": False}


ATTACK_PARAMS = _params_schema([*PARAMS["fgsm"], *PARAMS["pgd"], "loss"])
SEARCH_PARAMS = _params_schema([*SEARCH, *(k for own in OWN_PARAMS.values() for k in own)])


class PerturbationRender(BaseModel):
    """Pictures of the perturbation, per example and input: the perturbed image (image
    inputs), and the difference from the input (a diverging heat map, or bars for tabular
    rows). The attributions route's render fields, PNG only."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["png"] = Field(default="png", description="image/png (the only format)")
    kind: Literal["heatmap", "overlay"] = Field(
        default="heatmap",
        description="image inputs: the difference alone, or blended over the input image",
    )
    sign: Literal["absolute", "positive", "negative", "all"] = Field(
        default="all",
        description="which changes to show: |d|, d > 0, d < 0, or all (diverging colours)",
    )
    colormap: str | None = Field(default=None, description="the difference's colormap")
    examples: list[int] | None = Field(
        default=None, description="which examples to draw (indices); default all"
    )
    width: int | None = Field(
        default=480,
        ge=64,
        le=2048,
        description="the pictures' width in pixels (null: their own size)",
    )


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Inputs
    target: Target = Field(default="predicted", description=TARGET_NOTE)
    seed: int | None = Field(
        default=None, description="seeds the random draws (params.seed where they have one)"
    )
    output_encoding: Literal["json", "base64"] = Field(
        default="json", description="tensor encoding"
    )
    deadline_ms: float | None = Field(
        default=None, gt=0, description="abandon the request after this long (504)"
    )
    render: PerturbationRender | None = Field(
        default=None, description="also draw the perturbations (the response gains renders)"
    )


class AttackRequest(_Common):
    """Perturb the inputs, within a budget, to change the model's answer."""

    method: Literal["fgsm", "pgd"] = Field(description="fgsm or pgd")
    params: Annotated[dict[str, Any], WithJsonSchema(ATTACK_PARAMS)] = Field(
        default_factory=dict,
        description="fgsm: epsilon (required), targeted, lower_bound, upper_bound, mask, loss. "
        "pgd: radius, step_size, step_num (required), norm (Linf | L2), targeted, "
        "random_start, seed, lower_bound, upper_bound, mask, loss. loss: nll (default: "
        "-log output[target], for models that return probabilities), cross_entropy "
        "(for logits; it saturates where the softmax rounds to 1, and nothing moves: see "
        "zero_gradient) or margin (the largest other output minus the target's, raised by an "
        "attack, lowered by a targeted one; it does not saturate); per example, summed over "
        "the batch",
    )


class CounterfactualRequest(_Common):
    """Per example, the least perturbation that changes the model's answer."""

    perturbation: Literal["gaussian_noise", "fgsm", "pgd", "feature_ablation"] = Field(
        description="what is varied: gaussian_noise (std), fgsm (epsilon), pgd (radius), "
        "feature_ablation (features removed, most important first)"
    )
    params: Annotated[dict[str, Any], WithJsonSchema(SEARCH_PARAMS)] = Field(
        default_factory=dict,
        description="arg_min, arg_max, arg_step (required), mode (linear | binary), and the "
        "perturbation's own: gaussian_noise: seed; fgsm: targeted, lower_bound, upper_bound, "
        "mask, loss (nll | cross_entropy | margin); pgd: step_size, step_num, norm, and fgsm's; "
        "feature_ablation: attribution_method (default saliency), attribution_params, "
        "feature_mask, baselines",
    )


class PerturbationPicture(BaseModel):
    example: int = Field(description="the example drawn (index into the batch)")
    input: str | None = Field(default=None, description="multi-input models: the input drawn")
    picture: Literal["perturbed", "difference"]
    media_type: Literal["image/png"]
    b64: str = Field(description="the file's bytes, base64")


class _Result(BaseModel):
    model_id: str
    model_version: str
    perturbed: Annotated[
        Any,
        _result(
            "the perturbed inputs, in the inputs' form (one tensor per input on multi-input "
            "models)",
            TENSOR_LIST,
            RESULT_NUMBERS,
            TENSOR_B64,
        ),
    ]
    predictions: Annotated[
        Any,
        _result("the model's whole output on the perturbed inputs", RESULT_NUMBERS, TENSOR_B64),
    ]
    predicted: list[int] = Field(description="the top class on the perturbed inputs")
    target: list[Any] | None = Field(description="the resolved target, one per example")
    params: dict[str, Any] = Field(description="every effective parameter")
    renders: list[PerturbationPicture] | None = None
    timing_ms: TimingMs


class AttackResponse(_Result):
    method: str
    flipped: list[bool] = Field(
        description="per example: the top class differs from the unperturbed input's"
    )
    zero_gradient: list[bool] = Field(
        description="per example: the loss's gradient was zero (every element the mask lets "
        "move at most 1e-6, Captum's threshold) at every step, so no step moved it (a random "
        "start may have): not flipped says nothing of robustness then; params.loss "
        '"margin" does not saturate'
    )


class CounterfactualResponse(_Result):
    perturbation: str
    min_param: list[float | None] = Field(
        description="per example: the least parameter that flips it; null where none in range "
        "does (its perturbed input is then the input itself)"
    )
