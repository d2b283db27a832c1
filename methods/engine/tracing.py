"""Running a model op by op: its ``torch.fx`` graph, when that is safe, cached per model.

Incremental occlusion (``incremental``) looks inside a model instead of calling it whole. It
needs a model whose ops can be replayed one at a time with the same results: an
``nn.Module`` (not TorchScript) whose torch layers are in eval mode (dropout and batch norm
are then deterministic functions of their input), with no module hooks (which would see parts
of tensors, or nothing), and that ``torch.fx`` can trace, on any input (``trace``) or on
inputs of one shape (``trace_at``). What is derived from the graph is cached weakly per model
and recomputed when the model's set of submodules changes (a layer replaced).
"""

from __future__ import annotations

import inspect
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor, fx, nn
from torch.fx.experimental import meta_tracer

from methods.engine.guard import is_torchscript

T = TypeVar("T")
Cache = weakref.WeakKeyDictionary[nn.Module, tuple[tuple[nn.Module, ...], Any]]


def replayable_modules(model: Any) -> tuple[nn.Module, ...] | None:
    """The model's submodules if it can be run op by op, else None.

    The model itself is left out of the answer: caches keyed weakly by the model must not
    hold it (or it would never be freed).
    """
    if not isinstance(model, nn.Module) or is_torchscript(model):
        return None
    tree = _TREES.get(model)
    if (
        tree is None
        or tuple(model._modules.values()) != tree[0]
        or any(tuple(m._modules.values()) != kids for m, kids in tree[1])
    ):
        # first sight, or a submodule was added, removed or replaced
        subs = tuple(model.modules())[1:]
        tree = (
            tuple(model._modules.values()),
            tuple((m, tuple(m._modules.values())) for m in subs),
            subs,
        )
        _TREES[model] = tree
    if not _plain(model) or not all(_plain(m) for m in tree[2]):
        return None
    g = nn.modules.module
    if g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks:
        return None
    if getattr(g, "_global_backward_pre_hooks", None):
        return None
    return tree[2]  # the same tuple until the structure changes: ``analysed`` keys on it


def _plain(m: nn.Module) -> bool:
    """No hooks, called the standard way (no ``forward`` or ``__call__`` replaced on the
    instance or by overriding ``__call__``), and in eval mode if ``torch.fx`` keeps it whole
    (torch's own layers: dropout, batch norm). A module fx traces into may be in training
    mode (a wrapper built around an eval-mode model): what its code reads of ``training`` is
    in the graph, and ``state`` sees the flag change."""
    if m.training and _LEAF(m, ""):
        return False
    if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
        return False
    if m._backward_pre_hooks or "forward" in vars(m) or "__call__" in vars(m):
        return False
    return type(m).__call__ is nn.Module.__call__


#: per model, its children and each submodule's children as last seen: checking that they are
#: unchanged costs a fraction of walking ``model.modules()`` (a recursive generator) per call
_TREES: weakref.WeakKeyDictionary[
    nn.Module,
    tuple[tuple[Any, ...], tuple[tuple[nn.Module, tuple[Any, ...]], ...], tuple[nn.Module, ...]],
]
_TREES = weakref.WeakKeyDictionary()


_LEAF = fx.Tracer().is_leaf_module


def state(model: nn.Module) -> tuple[Any, ...]:
    """What a traced ``forward`` may have read from the model and its submodules, comparable
    with ``==``: plain values as they are, containers by their items' identities, anything
    else by identity. A changed flag, threshold or replaced tensor changes it."""
    return tuple(tuple((k, _token(v)) for k, v in vars(m).items()) for m in model.modules())


def _token(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, dict):
        return tuple((k, id(x)) for k, x in v.items())
    if isinstance(v, (tuple, list)):
        return (type(v), tuple(_token(x) for x in v))
    return id(v)


def analysed(cache: Cache, model: Any, analyse: Callable[[nn.Module], T | None]) -> T | None:
    """``analyse(model)``, cached in ``cache`` while the model keeps the same submodules;
    None when the model cannot be replayed op by op."""
    mods = replayable_modules(model)
    if mods is None:
        return None
    hit = cache.get(model)
    if hit is None or hit[0] is not mods:
        hit = (mods, analyse(model))
        cache[model] = hit
    result: T | None = hit[1]
    return result


class _OwnThread(fx.Tracer):
    """While ``torch.fx`` traces, it patches ``nn.Module.__call__`` and ``__getattr__``
    process-wide: a forward in another thread was recorded into this graph, or failed
    ("module is not installed as a submodule"). Module calls and attribute reads from any
    thread but the tracing one run as they would without the patch."""

    _owner = -1

    def trace(self, root: Any, *args: Any, **kwargs: Any) -> fx.Graph:
        self._owner = threading.get_ident()
        return super().trace(root, *args, **kwargs)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if threading.get_ident() != self._owner:
            return forward(*args, **kwargs)
        return super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        if threading.get_ident() != self._owner:
            return attr_val
        return super().getattr(attr, attr_val, parameter_proxy_cache)


class _MetaTracer(_OwnThread, meta_tracer.MetaTracer):
    pass


def _graph_module(tracer: fx.Tracer, graph: fx.Graph, model: nn.Module) -> fx.GraphModule:
    return fx.GraphModule(tracer.root, graph, type(model).__name__)


def trace(model: nn.Module) -> fx.GraphModule | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tracer = _OwnThread()
            return _graph_module(tracer, tracer.trace(model), model)
    except Exception:  # any untraceable forward simply takes the plain path
        return None


def trace_at(model: nn.Module, x: Tensor) -> fx.GraphModule | None:
    """The graph of ``model`` on inputs shaped like ``x``, for a forward that branches on
    shapes (``if x.shape[1] != self.num_channels: raise``, as Hugging Face models do), which
    ``trace`` cannot follow: its first argument is a meta tensor, so shapes are concrete
    while no value is computed. The graph holds for that shape only; None when it fails."""
    try:
        first = next(iter(inspect.signature(model.forward).parameters))
        meta = {first: torch.empty(x.shape, dtype=x.dtype, device="meta")}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tracer = _MetaTracer()
            return _graph_module(tracer, tracer.trace(model, meta), model)
    except Exception:  # as for ``trace``: the plain path
        return None
