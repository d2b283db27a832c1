"""Which methods a model can serve, and the token-model rewrite onto the embedding layer."""

from __future__ import annotations

from dataclasses import dataclass

from methods import registry
from methods.registry import MethodSpec
from model_registry.spec import ModelSpec
from service.errors import InvalidRequest, UnknownMethod, UnsupportedMethod

#: gradient method -> the layer method computing it at a layer (the FAQ's advice for tokens)
LAYER_COUNTERPART = {
    "integrated_gradients": "layer_integrated_gradients",
    "input_x_gradient": "layer_gradient_x_activation",
    "saliency": "layer_gradient_x_activation",
    "gradient_shap": "layer_gradient_shap",
    "deeplift": "layer_deeplift",
    "deeplift_shap": "layer_deeplift_shap",
    "lrp": "layer_lrp",
}


@dataclass(frozen=True)
class Plan:
    """What the engine will run for a requested method on a model."""

    method: MethodSpec
    attributed_layer: str | None = None  # set when rewritten onto the embedding layer
    post_abs: bool = False


def method_spec(name: str) -> MethodSpec:
    try:
        return registry.get(name)
    except Exception as exc:  # UnknownMethodError
        raise UnknownMethod(str(exc), loc=("body", "method")) from None


def is_torchscript(spec: ModelSpec) -> bool:
    return spec.source.startswith("torchscript:")


def token_model(spec: ModelSpec) -> bool:
    return spec.embedding_layer is not None and all(
        i.dtype.startswith(("int", "uint")) for i in spec.inputs
    )


def plan(spec: ModelSpec, name: str, params: dict[str, object]) -> Plan:
    """Check ``name`` can run on ``spec``; rewrite gradient methods on token models."""
    ms = method_spec(name)
    loc = ("body", "method")
    if ms.needs_hooks and is_torchscript(spec):
        raise UnsupportedMethod(
            f"{name} needs module hooks, which TorchScript model {spec.id!r} does not allow; "
            "use saliency, input_x_gradient, integrated_gradients, gradient_shap or a "
            "perturbation method",
            loc=loc,
        )
    if ms.kind in ("layer", "neuron"):
        layer = params.get("layer")
        if layer is None:
            raise InvalidRequest(
                f"{name} needs params.layer, one of {list(spec.layers)}", loc=("body", "params")
            )
        if layer not in spec.layers and layer != spec.embedding_layer:
            raise InvalidRequest(
                f"layer {layer!r} is not exposed by model {spec.id!r}; its layers are "
                f"{list(spec.layers)}",
                loc=("body", "params", "layer"),
            )
    if ms.differentiates_inputs and ms.kind == "gradient" and token_model(spec):
        counterpart = LAYER_COUNTERPART.get(name)
        if counterpart is None or counterpart not in {s.name for s in registry.specs()}:
            raise UnsupportedMethod(
                f"{name} differentiates its inputs, but model {spec.id!r} takes token ids; "
                f"this server has no layer method to run it on the embedding layer "
                f"{spec.embedding_layer!r}"
                + (f" ({counterpart} is not available)" if counterpart else ""),
                loc=loc,
            )
        return Plan(registry.get(counterpart), spec.embedding_layer, post_abs=name == "saliency")
    return Plan(ms)


def served_methods(spec: ModelSpec) -> list[str]:
    """Method names a model can serve as requested (for ModelInfo.methods)."""
    names = []
    for ms in registry.specs():
        try:
            plan(spec, ms.name, {"layer": (spec.layers or (spec.embedding_layer,))[0]})
        except (UnsupportedMethod, InvalidRequest):
            continue
        names.append(ms.name)
    return names
