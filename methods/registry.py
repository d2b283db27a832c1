"""The method registry: one module per method, each registered by name with a decorator.

Method modules live in the family packages (``gradient``, ``perturbation``, ``layer``,
``neuron``) and are discovered on first use, so adding a method touches only its own module.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from methods.errors import UnknownMethodError
from methods.params import MethodParams

if TYPE_CHECKING:
    from methods.call import Call, Output

Kind = Literal["gradient", "perturbation", "layer", "neuron"]
FAMILIES = ("gradient", "perturbation", "layer", "neuron")
MethodFn = Callable[["Call", Any], "Output"]


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
    kind: Kind
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

    def info(self) -> MethodInfo:
        return MethodInfo(
            name=self.name,
            kind=self.kind,
            needs_hooks=self.needs_hooks,
            returns_delta=self.returns_delta,
            params=self.params.model_json_schema(),
            stochastic=self.stochastic,
            description=self.description,
        )


_REGISTRY: dict[str, MethodSpec] = {}
_loaded = False


def register(
    name: str,
    *,
    kind: Kind,
    params: type[MethodParams],
    needs_hooks: bool = False,
    returns_delta: bool = False,
    stochastic: bool = False,
    batching: str | None = None,
    differentiates_inputs: bool = True,
) -> Callable[[MethodFn], MethodFn]:
    """Register ``fn`` as the method ``name`` (the module's name, its wire name too)."""

    def deco(fn: MethodFn) -> MethodFn:
        if name in _REGISTRY:
            raise RuntimeError(f"method {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        _REGISTRY[name] = MethodSpec(
            name=name,
            kind=kind,
            fn=fn,
            params=params,
            needs_hooks=needs_hooks,
            returns_delta=returns_delta,
            stochastic=stochastic,
            batching=batching,
            differentiates_inputs=differentiates_inputs,
            description=doc,
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
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownMethodError(
            f"unknown method {name!r}{hint} (methods.available() lists them all)",
            argument="method",
        ) from None


def specs() -> list[MethodSpec]:
    _load()
    return sorted(_REGISTRY.values(), key=lambda s: (FAMILIES.index(s.kind), s.name))
