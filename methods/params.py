"""Method parameters: one frozen pydantic model per method, whose JSON schema is published."""

from __future__ import annotations

import math
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema

from methods.engine.quadrature import ApproximationMethod
from methods.errors import InvalidArgumentError, InvalidTypeError, UnknownParameterError

TENSOR_SCHEMA: dict[str, Any] = {
    "description": "A tensor: nested lists, or {dtype, shape, b64} (the service's tensor codec).",
    "anyOf": [
        {"type": "array", "items": {}},
        {
            "type": "object",
            "properties": {
                "dtype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer"}},
                "b64": {"type": "string"},
            },
            "required": ["dtype", "shape", "b64"],
        },
    ],
}

#: A tensor, or a tuple of tensors (one per input). Python callers pass torch tensors.
TensorParam = Annotated[Any, WithJsonSchema(TENSOR_SCHEMA)]
SUPERPIXELS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "segments the server computes on each image (methods.engine.superpixels)",
    "properties": {
        "superpixels": {
            "type": "object",
            "properties": {
                "algorithm": {"enum": ["slic", "felzenszwalb", "quickshift", "grid"]},
                "size": {"type": "array", "items": {"type": "integer", "minimum": 1}},
            },
            "required": ["algorithm"],
            "additionalProperties": True,
        }
    },
    "required": ["superpixels"],
    "additionalProperties": False,
}
#: Integer feature groups: a tensor (``TensorParam``'s forms), or on image inputs
#: ``{"superpixels": {"algorithm": ..., ...}}``, segments the engine computes per image
MaskParam = Annotated[
    Any,
    WithJsonSchema(
        {
            "description": "integer feature ids (a tensor), or on image inputs "
            '{"superpixels": {"algorithm": "slic" | "felzenszwalb" | "quickshift" | "grid", '
            "...scikit-image's parameters, or size: [h, w] for the grid}}",
            "anyOf": [*TENSOR_SCHEMA["anyOf"], SUPERPIXELS_SCHEMA],
        }
    ),
]
#: Python-only values (callables); the service never accepts them.
PythonOnly = Annotated[Any, WithJsonSchema({"description": "Python API only (a callable)."})]
#: a count or a size (``n_steps``, a window's side): an integer >= 1
PositiveInt = Annotated[int, Field(ge=1)]
#: a spread or a magnitude (a standard deviation, a budget): a number >= 0
NonNegativeFloat = Annotated[float, Field(ge=0)]


def marked_fields(model: type[BaseModel], marker: Any) -> frozenset[str]:
    """Fields of ``model`` annotated with ``marker`` (``TensorParam`` or ``PythonOnly``)."""
    tags = get_args(marker)[1:]
    return frozenset(
        name
        for name, f in model.model_fields.items()
        if any(any(m is t or m == t for t in tags) for m in f.metadata)
    )


class MethodParams(BaseModel):
    """Base of every method's parameters: immutable, unknown names rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


def _admits_bool(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Literal:
        return any(isinstance(v, bool) for v in get_args(annotation))
    if origin is Annotated:
        return _admits_bool(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_admits_bool(a) for a in get_args(annotation))
    return False


def _scalars(annotation: Any) -> tuple[bool, bool, set[Any]]:
    """What a field's type takes: (numbers, any string, the literal values)."""
    if annotation is Any:
        return True, True, set()
    if annotation in (int, float):
        return True, False, set()
    if annotation is str:
        return False, True, set()
    origin = get_origin(annotation)
    if origin is Literal:
        return False, False, set(get_args(annotation))
    if origin is Annotated:
        return _scalars(get_args(annotation)[0])
    if origin in (Union, types.UnionType, tuple, list):
        numbers, strings = False, False
        literals: set[Any] = set()
        for a in get_args(annotation):
            if a is Ellipsis:
                continue
            n, s, lit = _scalars(a)
            numbers, strings, literals = numbers or n, strings or s, literals | lit
        return numbers, strings, literals
    return False, True, set()  # anything else (models, tensors): pydantic decides


def check_values(model: type[MethodParams], params: dict[str, Any], prefix: str = "") -> None:
    """Refuse what pydantic's lax mode would read as a number although it is none: a bool
    (``n_steps=True`` is one step), a string of digits (``" 50 "``, ``"5_0"``), and NaN or an
    infinity (``1e999`` in JSON) where a number is expected. One rule for every parameter of
    every method and of the noise tunnel."""
    for name, value in params.items():
        field = model.model_fields.get(name)
        if field is None:
            continue
        numbers, strings, literals = _scalars(field.annotation)
        many = isinstance(value, (list, tuple))
        for i, v in enumerate(value if many else [value]):
            if isinstance(v, bool) and not _admits_bool(field.annotation):
                what = f"a number, not a bool ({v!r})"
            elif isinstance(v, str) and numbers and not strings and v not in literals:
                options = "".join(f" or {x!r}" for x in sorted(literals, key=str))
                what = f"a number{options}, not the string {v[:20]!r}"
            elif isinstance(v, float) and numbers and not math.isfinite(v):
                what = f"a finite number, not {v!r}"
            else:
                continue
            where = f"{name}.{i}" if many else name
            raise InvalidTypeError(f"{prefix}parameter {where!r} must be {what}", argument=where)


class NoParams(MethodParams):
    """This method takes no parameters beyond the shared ones."""


#: Captum's keyword -> ours, where we renamed one (IG's ``method`` clashes with the method name)
_CAPTUM_RENAMES = {"method": "approximation_method"}


#: each params model's all-defaults instance (immutable, so shared): most calls pass none
_DEFAULTS: dict[type[MethodParams], MethodParams] = {}


def parse_params(model: type[MethodParams], method: str, params: dict[str, Any]) -> MethodParams:
    if not params:
        found = _DEFAULTS.get(model)
        if found is None and not any(f.is_required() for f in model.model_fields.values()):
            found = _DEFAULTS[model] = model()
        if found is not None:
            return found
    check_values(model, params, f"{method}: ")
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        errors = exc.errors()
        # a union tries each member: the deepest error is the member the value is shaped like
        # (strides=(0,) is a tuple whose first size is too small, not a bad integer)
        err = max(errors, key=lambda e: sum(isinstance(p, int) for p in e["loc"]))
        name = _where(err["loc"])
        if err["type"] == "extra_forbidden":
            import difflib

            known = ", ".join(model.model_fields) or "none"
            close = difflib.get_close_matches(name, list(model.model_fields), n=2)
            renamed = _CAPTUM_RENAMES.get(name)
            if renamed in model.model_fields:
                close = [renamed]  # Captum's spelling of the same parameter
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ";"
            raise UnknownParameterError(
                f"{method} has no parameter {name!r}{hint} its parameters are: {known}",
                argument=name,
            ) from None
        # a union reports one error per member it tried: say them all ("an integer or 'auto'")
        msgs = list(dict.fromkeys(_message(e) for e in errors if _where(e["loc"]) == name))
        kind = InvalidTypeError if err["type"].endswith("_type") else InvalidArgumentError
        raise kind(
            f"{method}: parameter {name!r}: {'; or '.join(msgs)}", argument=_where(err["loc"][:1])
        ) from None


#: pydantic's range errors, said as the bound they break ("Input should be >= 1")
_BOUNDS = {
    "greater_than_equal": ">=",
    "greater_than": ">",
    "less_than_equal": "<=",
    "less_than": "<",
}


def _message(err: Any) -> str:
    sign = _BOUNDS.get(err["type"])
    if sign is None:
        return str(err["msg"])
    return f"Input should be {sign} {next(iter(err.get('ctx', {}).values()), '?')}"


def _where(loc: tuple[int | str, ...]) -> str:
    """A parameter's dotted path without pydantic's union-member tags ("n_steps.int",
    "strides.tuple[int, ...].0"): the field name, then indexes only (params are flat)."""
    if not loc:
        return "params"
    return ".".join([str(loc[0]), *(str(p) for p in loc[1:] if isinstance(p, int))])


# --- Fields several methods share, defined once and composed into their params models.
# A method that needs another default or wording redefines the one field in its own model.


class FeatureMaskParams(MethodParams):
    feature_mask: MaskParam = Field(
        None,
        description="integer feature ids per input, broadcastable to it with dim 0 of 1 or N; "
        "elements sharing an id (also across inputs) are perturbed together as one feature; "
        'on images, {"superpixels": {...}} segments each image (the answer carries them). '
        "Default: every scalar is its own feature",
    )


def auto_tolerance() -> Any:
    """The ``tolerance`` of ``n_samples="auto"`` (the sampled Shapley methods)."""
    return Field(
        0.05,
        gt=0,
        lt=1,
        description="n_samples='auto' only: the largest standard error accepted, as a fraction "
        "of the example's largest |attribution|",
    )


class SurrogateParams(FeatureMaskParams):
    """Methods that fit a linear model on sampled coalitions (kernel_shap, lime)."""

    n_samples: int = Field(25, gt=0, description="perturbed samples the surrogate is fitted on")
    return_input_shape: bool = Field(
        True,
        description="map coefficients onto the inputs' shape; false returns (N, n_features)",
    )


class MultiplyByInputsParams(MethodParams):
    multiply_by_inputs: bool = Field(
        True,
        description="multiply by the difference between the inputs (for layer methods, the "
        "layer's values) and the baselines; false returns the global attribution alone",
    )


class QuadratureParams(MethodParams):
    approximation_method: ApproximationMethod = Field(
        "gausslegendre", description="quadrature rule along the path"
    )


class PathParams(QuadratureParams):
    """Methods that integrate gradients along the path from the baselines to the inputs."""

    n_steps: int = Field(50, ge=1, description="integration points along the path")


class NoisySamplesParams(MultiplyByInputsParams):
    """Methods that average gradients over noisy samples between baselines and inputs."""

    n_samples: int = Field(5, ge=1, description="random samples per example")
