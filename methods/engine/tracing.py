"""Running a model op by op: its ``torch.fx`` graph, when that is safe, cached per model.

Two engine paths look inside a model instead of calling it whole: incremental occlusion
(``incremental``) and the autograd-free backward of layer chains (``chain``). Both need a
model whose ops can be replayed one at a time with the same results: an ``nn.Module`` (not
TorchScript) in eval mode (dropout and batch norm are then deterministic functions of their
input), with no module hooks (which would see parts of tensors, or nothing), and that
``torch.fx`` can trace. What each path derives from the graph is cached weakly per model and
recomputed when the model's set of submodules changes (a layer replaced).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from torch import fx, nn

from methods.engine.guard import is_torchscript

T = TypeVar("T")
Cache = weakref.WeakKeyDictionary[nn.Module, tuple[tuple[nn.Module, ...], Any]]


def replayable_modules(model: Any) -> tuple[nn.Module, ...] | None:
    """The model's modules if it can be run op by op, else None."""
    if not isinstance(model, nn.Module) or is_torchscript(model):
        return None
    tree = _TREES.get(model)
    if tree is None or any(tuple(m._modules.values()) != kids for m, kids in tree):
        # first sight, or a submodule was added, removed or replaced
        tree = tuple((m, tuple(m._modules.values())) for m in model.modules())
        _TREES[model] = tree
    for m, _ in tree:
        if m.training or m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return None
        if m._backward_pre_hooks:
            return None
    g = nn.modules.module
    if g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks:
        return None
    return tuple(m for m, _ in tree)


#: per model, its modules and each one's children as last seen: checking that the children are
#: unchanged costs a fraction of walking ``model.modules()`` (a recursive generator) per call
_TREES: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[nn.Module, tuple[Any, ...]], ...]]
_TREES = weakref.WeakKeyDictionary()


def analysed(cache: Cache, model: Any, analyse: Callable[[nn.Module], T | None]) -> T | None:
    """``analyse(model)``, cached in ``cache`` while the model keeps the same submodules;
    None when the model cannot be replayed op by op."""
    mods = replayable_modules(model)
    if mods is None:
        return None
    hit = cache.get(model)
    if hit is None or hit[0] != mods:
        hit = (mods, analyse(model))
        cache[model] = hit
    result: T | None = hit[1]
    return result


def trace(model: nn.Module) -> fx.GraphModule | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fx.symbolic_trace(model)
    except Exception:  # any untraceable forward simply takes the plain path
        return None
