"""Which methods a model can serve, and what the engine runs for a request.

Everything here is read off the method's registry entry (``MethodSpec``): its kind, whether it
takes a layer, its token-model counterpart. No method names are listed in the service.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from methods import registry
from methods.registry import MethodSpec
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest, UnknownMethod, UnsupportedMethod, from_engine

#: engine arguments that are request fields of their own; a Captum user may put them in params
SHARED_ARGUMENTS = (
    "inputs",
    "target",
    "baselines",
    "additional_forward_args",
    "internal_batch_size",
    "perturbations_per_eval",
    "noise_tunnel",
    "seed",
    "return_convergence_delta",
)


@dataclass(frozen=True)
class Plan:
    """What the engine will run for a requested method on a model."""

    method: MethodSpec  # what runs
    params: dict[str, Any] = field(default_factory=dict)  # the raw params, rewritten for it
    attributed_layer: str | None = None  # set when rewritten onto the embedding layer
    post_abs: bool = False


def method_spec(name: str) -> MethodSpec:
    try:
        return registry.get(name)
    except Exception as exc:  # UnknownMethodError: its message, pointing at GET /v1/methods
        err = from_engine(exc)
        raise UnknownMethod(err.detail, loc=("body", "method")) from None


def is_torchscript(spec: ModelSpec) -> bool:
    return spec.source.startswith("torchscript:")


def token_model(spec: ModelSpec) -> bool:
    return spec.embedding_layer is not None and all(
        i.dtype.startswith(("int", "uint")) for i in spec.inputs
    )


def check_param_names(ms: MethodSpec, params: dict[str, Any]) -> None:
    """Shared arguments put inside ``params``, Captum's IG ``method=``, Python-only params."""
    for name in params:
        loc = ("body", "params", name)
        if name in SHARED_ARGUMENTS:
            raise InvalidRequest(
                f"{name} is a field of the request body, not a method parameter: move it out "
                f'of "params" to the top level ("{name}": ...)',
                loc=loc,
            )
        if name == "method":
            if "approximation_method" in ms.params.model_fields:
                raise InvalidRequest(
                    "params.method is Captum's name for the quadrature rule; here it is "
                    'params.approximation_method ("gausslegendre", "riemann_left", '
                    '"riemann_right", "riemann_middle", "riemann_trapezoid")',
                    loc=loc,
                )
            raise InvalidRequest(
                'the method is the request\'s top-level "method" field, not a parameter',
                loc=loc,
            )
        if name in ms.python_only_params:
            raise InvalidRequest(
                f"{ms.name}: parameter {name!r} takes a Python callable and is available only "
                "through the Python API (methods.attribute), not over HTTP",
                loc=loc,
            )


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
    if not isinstance(layer, str) or layer not in exposed:
        shown = layer if isinstance(layer, str) else type(layer).__name__
        raise InvalidRequest(
            f"layer {shown!r} is not exposed by model {spec.id!r}; its layers are {exposed}",
            loc=("body", "params", "layer"),
        )
    return params


def plan(spec: ModelSpec, name: str, params: dict[str, Any]) -> Plan:
    """Check ``name`` can run on ``spec``; rewrite gradient methods on token models."""
    ms = method_spec(name)
    check_param_names(ms, params)
    if spec.exported is not None:  # the file's one method, its layer (if any) baked in
        from service.kinds.exported import check_method

        check_method(spec, name)
        return Plan(ms, dict(params))
    loc = ("body", "method")
    if ms.needs_hooks and is_torchscript(spec):
        raise UnsupportedMethod(
            f"{name} needs module hooks, which TorchScript model {spec.id!r} does not allow; "
            "use saliency, input_x_gradient, integrated_gradients, gradient_shap or a "
            "perturbation method",
            loc=loc,
        )
    if ms.layer_param:
        params = _check_layer(spec, ms, params)
    if ms.differentiates_inputs and ms.kind != "layer" and token_model(spec):
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
    return Plan(ms, dict(params))


def served_methods(spec: ModelSpec) -> list[str]:
    """Method names a model can serve as requested (for ModelInfo.methods)."""
    if spec.kind == "causal_lm":
        from service.kinds.causal_lm import served_methods as generation_methods

        return generation_methods()
    names = []
    for ms in registry.specs():
        try:
            plan(spec, ms.name, {"layer": (spec.layers or (spec.embedding_layer,))[0]})
        except (UnsupportedMethod, InvalidRequest):
            continue
        names.append(ms.name)
    return names
