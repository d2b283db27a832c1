"""Which methods a tensor model can serve, and what the engine runs for a request: gradient
methods on token models run as their layer counterpart on the embedding layer.

Everything here is read off the method's registry entry (``MethodSpec``): its kind, whether it
takes a layer, its token-model counterpart. No method names are listed in the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from methods import registry
from methods.engine.superpixels import is_image_shape
from methods.registry import MethodSpec
from model_registry.sources import source_of
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.kinds.checks import check_param_names, method_spec


@dataclass(frozen=True)
class Plan:
    """What the engine will run for a requested method on a model."""

    method: MethodSpec  # what runs
    params: dict[str, Any] = field(default_factory=dict)  # the raw params, rewritten for it
    attributed_layer: str | None = None  # set when rewritten onto the embedding layer
    post_abs: bool = False


def hookable(spec: ModelSpec) -> bool:
    """Whether the model takes module hooks, as its source declares."""
    source = source_of(spec)
    return source is None or source.hookable


def differentiable(spec: ModelSpec) -> bool:
    """Whether gradients of the model's output reach its inputs, as its source declares."""
    source = source_of(spec)
    return source is None or source.differentiable


def token_model(spec: ModelSpec) -> bool:
    """Whether the model takes token ids (gradient methods then attribute to its embedding)."""
    return spec.embedding_layer is not None and all(
        i.dtype.startswith(("int", "uint")) for i in spec.inputs
    )


def images(spec: ModelSpec) -> bool:
    """Whether the model takes one image: ``[N, 1 or 3, H, W]`` floats (or encoded images its
    processor makes so)."""
    if spec.images is not None:
        return True
    if len(spec.inputs) != 1:
        return False
    only = spec.inputs[0]
    return only.dtype.startswith(("float", "bfloat")) and is_image_shape(only.shape[1:])


def _check_layer(spec: ModelSpec, ms: MethodSpec, params: dict[str, Any]) -> dict[str, Any]:
    exposed = list(spec.layers)
    if spec.embedding_layer is not None and spec.embedding_layer not in exposed:
        exposed.append(spec.embedding_layer)
    layer = params.get("layer")
    if layer is None:
        if token_model(spec):  # the FAQ's advice: attribute token models at the embedding
            return {**params, "layer": spec.embedding_layer}
        raise InvalidRequest(
            f"{ms.name} needs params.layer, one of {exposed}", loc=("body", "params", "layer")
        )
    many = isinstance(layer, list)
    if many and not (layer and ms.layer_lists):
        raise InvalidRequest(
            f"{ms.name} takes one layer, not a list"
            if layer
            else "params.layer is an empty list; give one layer or a non-empty list of them",
            loc=("body", "params", "layer"),
        )
    for i, one in enumerate(layer if many else [layer]):
        if not isinstance(one, str) or one not in exposed:
            shown = one if isinstance(one, str) else type(one).__name__
            raise InvalidRequest(
                f"layer {shown!r} is not exposed by model {spec.id!r}; its layers are {exposed}",
                loc=("body", "params", "layer", i) if many else ("body", "params", "layer"),
            )
    return params


def plan(spec: ModelSpec, name: str, params: dict[str, Any]) -> Plan:
    """Check ``name`` can run on ``spec``; rewrite gradient methods on token models."""
    ms = method_spec(name)
    check_param_names(ms, params)
    loc = ("body", "method")
    if ms.family != "perturbation" and not differentiable(spec):
        where = (
            f"served remotely (by the {spec.remote.describe()})"
            if spec.remote is not None
            else "served elsewhere"
        )
        raise UnsupportedMethod(
            f"{name} needs the gradients of model {spec.id!r}, which is {where} and offers "
            "forwards only; use a perturbation method (feature_ablation, "
            "occlusion, feature_permutation, shapley_value_sampling, kernel_shap, lime)",
            loc=loc,
        )
    if ms.images_only and not images(spec):
        shapes = ", ".join(f"{i.dtype} {list(i.shape)}" for i in spec.inputs)
        raise UnsupportedMethod(
            f"{name} attributes one image input, [N, 1 or 3, H, W] floats; model {spec.id!r} "
            f"takes {shapes}",
            loc=loc,
        )
    if ms.needs_hooks and not hookable(spec):
        raise UnsupportedMethod(
            f"{name} needs module hooks, which TorchScript model {spec.id!r} does not allow; "
            "use saliency, input_x_gradient, integrated_gradients, gradient_shap or a "
            "perturbation method",
            loc=loc,
        )
    if ms.layer_param:
        params = _check_layer(spec, ms, params)
    if ms.differentiates_inputs and ms.family != "layer" and token_model(spec):
        tc = ms.token_counterpart
        if tc is None:
            raise UnsupportedMethod(
                f"{name} differentiates its inputs, but model {spec.id!r} takes token ids; "
                f"it has no layer counterpart to run on the embedding layer "
                f"{spec.embedding_layer!r}: use a layer method or a perturbation method",
                loc=loc,
            )
        rewritten = {k: v for k, v in params.items() if k not in tc.drop_params}
        rewritten.update(tc.set_params)
        rewritten["layer"] = spec.embedding_layer
        post_abs = tc.post_abs and params.get("abs", True) is not False  # saliency's abs=False
        return Plan(registry.get(tc.method), rewritten, spec.embedding_layer, post_abs)
    if ms.family == "layer" and token_model(spec) and params.get("layer") == spec.embedding_layer:
        # a layer method asked at the embedding (by name, or by default): text attributions
        # are one score per token, summed over the embedding dim, as for the rewrite above
        return Plan(ms, dict(params), spec.embedding_layer)
    return Plan(ms, dict(params))


def served(spec: ModelSpec) -> list[str]:
    """Method names a tensor model can serve as requested (for ModelInfo.methods)."""
    names = []
    for ms in registry.specs():
        try:
            plan(spec, ms.name, {"layer": (spec.layers or (spec.embedding_layer,))[0]})
        except (UnsupportedMethod, InvalidRequest):
            continue
        names.append(ms.name)
    return names
