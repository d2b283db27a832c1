"""The method registry: one module per method, each registered by name with a decorator.

Method modules live in the family packages (``gradient``, ``perturbation``, ``layer``,
``neuron``) and are discovered on first use, so adding a method touches only its own module.
Each entry also carries what a server needs to know about its method (cost, merging, token
counterpart, tensor and Python-only params, limits), stated at registration or derived from
the params model: the one source of truth, never a table of names elsewhere.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from methods.cost import CostFn, CostShape, derived_cost
from methods.errors import UnknownMethodError
from methods.params import MaskParam, MethodParams, PythonOnly, TensorParam, marked_fields

if TYPE_CHECKING:
    from methods.engine.call import Call, Output

Family = Literal["gradient", "perturbation", "layer", "neuron"]
FAMILIES = ("gradient", "perturbation", "layer", "neuron")
MethodFn = Callable[["Call", Any], "Output"]
#: how ``methods.attribute_generation`` runs a method on a generated answer: a perturbation
#: method covering every output value at once ("per_output"), one surrogate fit per output
#: value ("fitted"), a gradient method at the token embedding ("layer_gradient"), or through
#: its token counterpart ("gradient")
Generation = Literal["per_output", "fitted", "layer_gradient", "gradient"]

__all__ = [
    "FAMILIES",
    "CostShape",
    "Family",
    "MethodFn",
    "MethodInfo",
    "MethodSpec",
    "TokenCounterpart",
    "get",
    "register",
    "specs",
]


@dataclass(frozen=True)
class TokenCounterpart:
    """The layer method computing a gradient method at a token model's embedding layer: the
    request's params minus ``drop_params``, updated with ``set_params``, plus ``layer``; with
    ``post_abs`` the absolute value is taken before summing over the embedding dim."""

    method: str
    post_abs: bool = False
    set_params: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    drop_params: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "set_params", MappingProxyType(dict(self.set_params)))


@dataclass(frozen=True)
class MethodInfo:
    """What ``methods.available()`` lists and the service publishes."""

    name: str
    kind: str
    needs_hooks: bool
    returns_delta: bool
    params: dict[str, Any]
    stochastic: bool = False
    description: str = ""


@dataclass(frozen=True)
class MethodSpec:
    name: str
    family: Family
    fn: MethodFn
    params: type[MethodParams]
    needs_hooks: bool = False
    returns_delta: bool = False
    stochastic: bool = False
    #: "internal_batch_size", "perturbations_per_eval" or None: which chunking knob applies.
    batching: str | None = None
    #: needs floating-point inputs (it differentiates with respect to them)
    differentiates_inputs: bool = True
    description: str = field(default="")
    #: forward rows one example costs; None: derived from the params model (see methods.cost)
    cost_fn: CostFn | None = None
    #: tensor baselines are a distribution every example samples from (the SHAP methods), not
    #: one baseline per example
    baseline_distribution: bool = False
    #: whether, with these (validated) params, an example's result depends on the other
    #: examples of the same call (a permutation across the batch, a surrogate sampled per
    #: call, a step count chosen for the whole call); None: never
    couples_examples: Callable[[Any], bool] | None = None
    token_counterpart: TokenCounterpart | None = None
    #: False where the method ignores ``target`` (neuron methods select a neuron instead)
    needs_target: bool = True
    #: the most steps ``n_steps="auto"`` may take with these params (methods that have it)
    auto_steps: Callable[[Any], int] | None = None
    #: the most samples ``n_samples="auto"`` may draw (methods that have it)
    auto_samples: int | None = None
    #: how attribute_generation runs it on a generated answer (None: it does not)
    generation: Generation | None = None
    #: whether its whole computation is a fixed graph of tensor ops over the batch, so
    #: ``methods.export`` can trace it into a program
    exportable: bool = False
    #: takes inputs after the first whose dim 0 is not the batch (Captum's sparse features),
    #: fed whole to every evaluation, one perturbation per forward
    sparse_inputs: bool = False
    #: runs the model forward only (no gradient of it): layout choices cannot move its
    #: answer past rounding (``methods.engine.layout``)
    forward_only: bool = False
    #: a Shapley-family answer: it reports each example's ``base_values`` (the targeted output
    #: at the baselines, their mean over a background set), which its attributions complete to
    #: the output (``sum + base_value == output`` where the method is exact)
    base_values: bool = False
    #: takes a background set itself (``Background`` baselines), averaging each coalition's
    #: value over the rows before crediting, as shap's maskers do; other methods are run
    #: once per row and their answers averaged (``methods.engine.tiling``)
    own_background: bool = False
    #: attributes images only (one input, ``[N, C, H, W]`` or ``[N, H, W]``): it blurs or
    #: segments them (blur_ig, xrai)
    images_only: bool = False

    def info(self) -> MethodInfo:
        return MethodInfo(
            name=self.name,
            kind=self.family,
            needs_hooks=self.needs_hooks,
            returns_delta=self.returns_delta,
            params=self.params.model_json_schema(),
            stochastic=self.stochastic,
            description=self.description,
        )

    def cost(self, p: MethodParams, shape: CostShape) -> int:
        """Forward rows one example costs with the validated params ``p`` (at least 1)."""
        fn = self.cost_fn or derived_cost(self.params)
        layers = getattr(p, "layer", None)
        per_layer = len(layers) if isinstance(layers, list) else 1  # each layer counted
        return max(1, int(fn(p, shape)) * per_layer)

    def coupled(self, p: MethodParams) -> bool:
        """Whether with params ``p`` an example's result depends on the others in its call."""
        return self.couples_examples is not None and bool(self.couples_examples(p))

    @cached_property
    def tensor_params(self) -> frozenset[str]:
        """Params annotated ``TensorParam`` or ``MaskParam``: a server decodes them from its
        tensor codec."""
        return marked_fields(self.params, TensorParam) | self.mask_params

    @cached_property
    def mask_params(self) -> frozenset[str]:
        """Params annotated ``MaskParam``: feature groups, given as a tensor or as a
        superpixels spec the engine resolves on the images (``methods.engine.superpixels``)."""
        return marked_fields(self.params, MaskParam)

    @cached_property
    def python_only_params(self) -> frozenset[str]:
        """Params annotated ``PythonOnly`` (callables): never accepted over HTTP."""
        return marked_fields(self.params, PythonOnly)

    @property
    def hierarchical(self) -> bool:
        """Whether the method credits a feature hierarchy (takes ``clustering``: partition),
        which a text model's tokenizer gives by default."""
        return "clustering" in self.params.model_fields

    @property
    def layer_param(self) -> bool:
        """Whether the method takes ``layer`` (layer and neuron methods, guided_gradcam)."""
        return "layer" in self.params.model_fields

    @property
    def layer_lists(self) -> bool:
        """Whether ``layer`` may be a list of layers (the layer methods, CONTRACT §7.7)."""
        field = self.params.model_fields.get("layer")
        arms = get_args(field.annotation) if field is not None else ()
        return any(get_origin(get_args(a)[0] if get_args(a) else a) is list for a in arms)


_REGISTRY: dict[str, MethodSpec] = {}
_loaded = False


def register(
    name: str,
    *,
    family: Family,
    params: type[MethodParams],
    needs_hooks: bool = False,
    returns_delta: bool = False,
    stochastic: bool = False,
    batching: str | None = None,
    differentiates_inputs: bool = True,
    cost: CostFn | None = None,
    baseline_distribution: bool = False,
    couples_examples: Callable[[Any], bool] | None = None,
    token_counterpart: TokenCounterpart | Literal["unstated"] | None = "unstated",
    needs_target: bool = True,
    auto_steps: Callable[[Any], int] | None = None,
    auto_samples: int | None = None,
    generation: Generation | None = None,
    exportable: bool = False,
    sparse_inputs: bool = False,
    forward_only: bool = False,
    base_values: bool = False,
    own_background: bool = False,
    images_only: bool = False,
) -> Callable[[MethodFn], MethodFn]:
    """Register ``fn`` as the method ``name`` (the module's name, its wire name too).

    A method differentiating its inputs outside the layer family must state its
    ``token_counterpart`` (None for none): token models take ids, which cannot be.
    """
    if token_counterpart == "unstated":
        if differentiates_inputs and family != "layer":
            raise RuntimeError(
                f"method {name!r} differentiates its inputs: state its token_counterpart "
                "(the layer method run at a token model's embedding layer, or None)"
            )
        token_counterpart = None

    def deco(fn: MethodFn) -> MethodFn:
        if name in _REGISTRY:
            raise RuntimeError(f"method {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        _REGISTRY[name] = MethodSpec(
            name=name,
            family=family,
            fn=fn,
            params=params,
            needs_hooks=needs_hooks,
            returns_delta=returns_delta,
            stochastic=stochastic,
            batching=batching,
            differentiates_inputs=differentiates_inputs,
            description=doc,
            cost_fn=cost,
            baseline_distribution=baseline_distribution,
            couples_examples=couples_examples,
            token_counterpart=token_counterpart,
            needs_target=needs_target,
            auto_steps=auto_steps,
            auto_samples=auto_samples,
            generation=generation,
            exportable=exportable,
            sparse_inputs=sparse_inputs,
            forward_only=forward_only,
            base_values=base_values,
            own_background=own_background,
            images_only=images_only,
        )
        return fn

    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for family in FAMILIES:
        pkg = importlib.import_module(f"methods.{family}")
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"methods.{family}.{mod.name}")
    _loaded = True


def get(name: str) -> MethodSpec:
    _load()
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        import difflib

        close = difflib.get_close_matches(str(name), list(_REGISTRY), n=3)
        err = UnknownMethodError(
            f"unknown method {name!r}{did_you_mean(close)} (methods.available() lists them all)",
            argument="method",
        )
        err.requested, err.suggestions = str(name), close  # the service names its own list
        raise err from None


def did_you_mean(close: list[str]) -> str:
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def specs() -> list[MethodSpec]:
    _load()
    return sorted(_REGISTRY.values(), key=lambda s: (FAMILIES.index(s.family), s.name))
