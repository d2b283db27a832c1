"""The JSON schemas of the wire's tensors, inputs, targets and baselines, shared by every
operation's request and response models (``service.wire.attributions`` and the others)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import WithJsonSchema

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
REGION_TARGET: dict[str, Any] = {
    "title": "RegionTarget",
    "description": "Segmentation models: a class's scores summed over a region of the output: "
    '"predicted" (the pixels whose argmax is the class, in the unperturbed output) or a mask '
    "(H×W of 0/1 on the output's pixels).",
    "type": "object",
    "properties": {
        "class": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
        "region": {
            "anyOf": [
                {"type": "string", "enum": ["predicted"]},
                {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
            ]
        },
    },
    "required": ["class", "region"],
    "additionalProperties": False,
}
BOX_TARGET: dict[str, Any] = {
    "title": "BoxTarget",
    "description": "Object detectors: the score of the detection of the label with the "
    "largest IoU with the box (x1, y1, x2, y2 in the model input's pixels), 0 where none "
    "reaches iou_threshold.",
    "type": "object",
    "properties": {
        "box": {"type": "array", "items": {"type": "number"}, "minItems": 4, "maxItems": 4},
        "label": {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]},
        "iou_threshold": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    },
    "required": ["box", "label"],
    "additionalProperties": False,
}
EXAMPLES: dict[str, Any] = {
    "title": "Examples",
    "description": 'Question answering: [{"question": "...", "context": "..."}, ...]; '
    'image–text similarity: [{"image": "<base64>", "text": "..."}, ...].',
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "question": {"type": "string"},
            "context": {"type": "string"},
            "image": {"type": "string"},
            "text": {"type": "string"},
        },
        "additionalProperties": False,
    },
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
    '"skip_tokens": [...]} (features null: every prompt token is a feature). Question '
    'answering takes [{"question", "context"}], image–text similarity [{"image", "text"}].',
    # a list of nested lists is itself nested lists: the model's input count tells them apart
    "anyOf": [TENSOR_LIST, NESTED_NUMBERS, TENSOR_B64, BY_NAME, TEXTS, IMAGES, EXAMPLES],
}
TARGET: dict[str, Any] = {
    "title": "Target",
    "description": "A class index for all examples (3), one per example ([3, 1, 0]), an index "
    'into outputs of more than one dim ({"index": [2, 3]}) or one per example, a label name '
    'or one per example, "predicted" (each example\'s argmax), or null (models with one '
    'output per example), {"top_k": K} (each example\'s K best classes); causal language '
    'models: the answer\'s text, or null to generate it; question answering: "start", '
    '"end" or "span" (the default); segmentation: {"class", "region"} (null: each example\'s '
    'dominant class); object detection: {"box", "label"} (null: each image\'s top '
    "detection); a list of these gives one per example.",
    "oneOf": [
        {"type": "integer"},
        {"type": "string"},
        INDEX_TARGET,
        TOP_K_TARGET,
        REGION_TARGET,
        BOX_TARGET,
        {  # one object target per example (clients' generators take one list of objects)
            "type": "array",
            "items": {
                "anyOf": [
                    INDEX_TARGET,
                    REGION_TARGET,
                    BOX_TARGET,
                    {"type": "integer"},
                    {"type": "string"},
                ]
            },
            "contains": {"anyOf": [INDEX_TARGET, REGION_TARGET, BOX_TARGET]},
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
    REGION_TARGET,
    BOX_TARGET,
    EXAMPLES,
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


def result_schema(description: str, *arms: dict[str, Any]) -> Any:
    """A response field's schema: one of ``arms``."""
    return WithJsonSchema({"description": description, "oneOf": list(arms)})
