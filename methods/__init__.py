"""attrserve's attribution engine: Captum's catalogue in pure torch, exact and fast.

import methods
res = methods.attribute(model, x, "integrated_gradients", target=1)
res.attributions, res.convergence_delta
"""

from methods.api import attribute, available
from methods.cancel import cancel_scope
from methods.concepts import TCAVResult, tcav
from methods.data_influence import InfluenceResult, influence, self_influence
from methods.dependence import FeatureDependence, partial_dependence
from methods.engine.background import Background
from methods.engine.batching import memory_budget, set_memory_budget
from methods.engine.call import Result
from methods.engine.kmeans import kmeans
from methods.errors import (
    AttributionCancelled,
    AttributionError,
    BaselineError,
    InvalidArgumentError,
    InvalidTypeError,
    ModelError,
    TargetError,
    UnknownMethodError,
    UnknownParameterError,
    UnsupportedModelError,
)
from methods.evaluation import evaluate
from methods.export import NotExportableError, export
from methods.generation import GenerationResult, attribute_generation
from methods.generation.context import ContextResult, attribute_context
from methods.generation.stream import GenerationStep, stream_generation
from methods.registry import MethodInfo
from methods.robustness import AttackResult, MinPerturbationResult, attack, min_perturbation

__all__ = [
    "AttackResult",
    "AttributionCancelled",
    "AttributionError",
    "Background",
    "BaselineError",
    "ContextResult",
    "FeatureDependence",
    "GenerationResult",
    "GenerationStep",
    "InfluenceResult",
    "InvalidArgumentError",
    "InvalidTypeError",
    "MethodInfo",
    "MinPerturbationResult",
    "ModelError",
    "NotExportableError",
    "Result",
    "TCAVResult",
    "TargetError",
    "UnknownMethodError",
    "UnknownParameterError",
    "UnsupportedModelError",
    "attack",
    "attribute",
    "attribute_context",
    "attribute_generation",
    "available",
    "cancel_scope",
    "evaluate",
    "export",
    "infidelity",
    "influence",
    "kmeans",
    "memory_budget",
    "min_perturbation",
    "partial_dependence",
    "self_influence",
    "sensitivity_max",
    "set_memory_budget",
    "stream_generation",
    "tcav",
]


def __getattr__(name: str) -> object:
    # The metrics arrive with the layer/neuron engine; imported lazily to keep import light.
    if name in ("infidelity", "sensitivity_max"):
        from methods import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'methods' has no attribute {name!r}")
