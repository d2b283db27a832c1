"""The one table of operations the engine treats specially, and what each method does to them.

Every rule-based method (DeepLift, guided backprop, deconvolution, LRP) and incremental
occlusion needs to recognise the same operations in a model: a ReLU as ``nn.ReLU``,
``F.relu``, ``torch.relu_`` or ``x.relu()``, a max-pool as a module or a functional call, and
so on. They are listed once here, each with its columns:

| op | kind | DeepLift | LRP | incremental occlusion |
|---|---|---|---|---|
| relu, elu, leaky_relu, sigmoid, tanh, softplus | elementwise | rescale | pass | local |
| relu6, selu, celu, gelu, silu, mish, hard* | elementwise | gradient | gradient | local |
| prelu, identity (modules only) | elementwise | gradient | gradient | local |
| softmax | softmax | softmax | gradient | no |
| max_pool{1,2,3}d | max_pool | max | relevance | local (window) |
| avg_pool, adaptive_{avg,max}_pool{1,2,3}d | pooling | gradient | relevance | local (window) |
| linear | weighted | gradient | relevance (weights) | no |
| conv{1,2,3}d | weighted | gradient | relevance (weights) | local (window) |
| batch_norm | weighted | gradient | relevance (weights) | local (eval mode) |
| dropout{,1d,2d,3d} | dropout | gradient | pass | local (eval mode) |

Guided backprop and deconvolution act on ReLU alone. The rules themselves live with their
methods as small named maps from a column value to a backward rule (see ``intercept``);
this module only says which op a torch callable, a module class or a Tensor method name is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Kind = Literal["elementwise", "softmax", "max_pool", "pooling", "weighted", "dropout"]
Derivative = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Op:
    """One operation: the callables that perform it, and what each consumer does with it."""

    name: str
    kind: Kind
    #: torch callables computing it out of place (the first is the canonical one)
    functions: tuple[Any, ...] = ()
    #: in-place variants, taking the same arguments as ``functions[0]``
    inplace: tuple[Any, ...] = ()
    modules: tuple[type[nn.Module], ...] = ()
    #: Tensor method names (``x.relu()``), as ``torch.fx`` records them
    methods: tuple[str, ...] = ()
    #: dy/dx from (x, y) for element-wise ops where it is cheap (no subgraph needed)
    derivative: Derivative | None = None
    #: spatial dims of pooling and convolutions
    dims: int = 0
    #: the DeepLift rule: "rescale" | "softmax" | "max"; None: the plain gradient
    deeplift: str | None = None
    #: the LRP rule: "pass" (relevance passes on) | "relevance"; None: the plain gradient
    lrp: str | None = None
    #: weighted ops: (position, keyword) of the weight and of the bias
    weight: tuple[tuple[int, str], tuple[int, str]] | None = None
    #: incremental occlusion can recompute it on boxes (local in space)
    local: bool = False
    #: functional pooling: its parameter names after the input, in order
    signature: tuple[str, ...] = ()


def _d_relu(x: Tensor, y: Tensor) -> Tensor:
    return (x > 0).to(x.dtype)


def _d_sigmoid(x: Tensor, y: Tensor) -> Tensor:
    return y * (1 - y)


def _d_tanh(x: Tensor, y: Tensor) -> Tensor:
    return 1 - y * y


def _elementwise(name: str, *functions: Any, **kw: Any) -> Op:
    return Op(name, "elementwise", functions=functions, local=True, **kw)


_MAX = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
_AVG = ("kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override")
_WEIGHT = ((1, "weight"), (2, "bias"))

OPS: tuple[Op, ...] = (
    _elementwise("relu", F.relu, torch.relu, Tensor.relu, inplace=(torch.relu_, Tensor.relu_),
                 modules=(nn.ReLU,), methods=("relu",), derivative=_d_relu, deeplift="rescale",
                 lrp="pass"),
    _elementwise("elu", F.elu, inplace=(F.elu_,), modules=(nn.ELU,), deeplift="rescale",
                 lrp="pass"),
    _elementwise("leaky_relu", F.leaky_relu, inplace=(F.leaky_relu_,),
                 modules=(nn.LeakyReLU,), deeplift="rescale", lrp="pass"),
    _elementwise("sigmoid", torch.sigmoid, Tensor.sigmoid, F.sigmoid,
                 inplace=(torch.sigmoid_, Tensor.sigmoid_), modules=(nn.Sigmoid,),
                 methods=("sigmoid",), derivative=_d_sigmoid, deeplift="rescale", lrp="pass"),
    _elementwise("tanh", torch.tanh, Tensor.tanh, F.tanh, inplace=(torch.tanh_, Tensor.tanh_),
                 modules=(nn.Tanh,), methods=("tanh",), derivative=_d_tanh, deeplift="rescale",
                 lrp="pass"),
    _elementwise("softplus", F.softplus, modules=(nn.Softplus,), deeplift="rescale", lrp="pass"),
    _elementwise("relu6", F.relu6, modules=(nn.ReLU6,)),
    _elementwise("selu", F.selu, modules=(nn.SELU,)),
    _elementwise("celu", F.celu, modules=(nn.CELU,)),
    _elementwise("gelu", F.gelu, modules=(nn.GELU,)),
    _elementwise("silu", F.silu, modules=(nn.SiLU,)),
    _elementwise("mish", F.mish, modules=(nn.Mish,)),
    _elementwise("hardtanh", F.hardtanh, modules=(nn.Hardtanh,)),
    _elementwise("hardswish", F.hardswish, modules=(nn.Hardswish,)),
    _elementwise("hardsigmoid", F.hardsigmoid, modules=(nn.Hardsigmoid,)),
    _elementwise("prelu", modules=(nn.PReLU,)),
    _elementwise("identity", modules=(nn.Identity,)),
    Op("softmax", "softmax", functions=(F.softmax, torch.softmax, Tensor.softmax),
       deeplift="softmax"),
    *(Op(f"max_pool{d}d", "max_pool", functions=(getattr(F, f"max_pool{d}d"),),
         modules=(getattr(nn, f"MaxPool{d}d"),), dims=d, deeplift="max", lrp="relevance",
         local=True, signature=_MAX) for d in (1, 2, 3)),
    *(Op(f"avg_pool{d}d", "pooling", functions=(getattr(F, f"avg_pool{d}d"),),
         modules=(getattr(nn, f"AvgPool{d}d"),), dims=d, lrp="relevance", local=True,
         signature=_AVG[:5] if d == 1 else _AVG) for d in (1, 2, 3)),
    *(Op(f"adaptive_avg_pool{d}d", "pooling", functions=(getattr(F, f"adaptive_avg_pool{d}d"),),
         modules=(getattr(nn, f"AdaptiveAvgPool{d}d"),), dims=d, lrp="relevance", local=True,
         signature=("output_size",)) for d in (1, 2, 3)),
    *(Op(f"adaptive_max_pool{d}d", "pooling", functions=(getattr(F, f"adaptive_max_pool{d}d"),),
         modules=(getattr(nn, f"AdaptiveMaxPool{d}d"),), dims=d, lrp="relevance", local=True,
         signature=("output_size", "return_indices")) for d in (1, 2, 3)),
    Op("linear", "weighted", functions=(F.linear,), modules=(nn.Linear,), lrp="relevance",
       weight=_WEIGHT),
    *(Op(f"conv{d}d", "weighted", functions=(getattr(F, f"conv{d}d"),),
         modules=(getattr(nn, f"Conv{d}d"),), dims=d, lrp="relevance", weight=_WEIGHT,
         local=True) for d in (1, 2, 3)),
    Op("batch_norm", "weighted", functions=(F.batch_norm,),
       modules=(nn.modules.batchnorm._BatchNorm,), lrp="relevance",
       weight=((3, "weight"), (4, "bias")), local=True),
    Op("dropout", "dropout", functions=(F.dropout, F.dropout1d, F.dropout2d, F.dropout3d),
       modules=(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout),
       lrp="pass", local=True),
)  # fmt: skip

#: torch callable (out of place or in place) -> its op
BY_FUNCTION: dict[Any, Op] = {f: op for op in OPS for f in (*op.functions, *op.inplace)}
#: in-place callable -> the out-of-place one with the same arguments
OUT_OF_PLACE: dict[Any, Any] = {f: op.functions[0] for op in OPS for f in op.inplace}
BY_NAME: dict[str, Op] = {op.name: op for op in OPS}


def of_module(m: nn.Module) -> Op | None:
    """The op a module performs (its exact class, or a listed base class)."""
    for op in OPS:
        if isinstance(m, op.modules):
            return op
    return None


def is_inplace(func: Any, kwargs: dict[str, Any]) -> bool:
    return func in OUT_OF_PLACE or bool(kwargs.get("inplace", False))


def as_tensors(v: Any) -> list[Tensor]:
    """``v`` as a list of tensors: a tensor, a tuple/list of them, or nothing."""
    if isinstance(v, Tensor):
        return [v]
    if isinstance(v, (tuple, list)):
        return [t for t in v if isinstance(t, Tensor)]
    return []
