"""The layers incremental occlusion can run on boxes, recognised in a ``torch.fx`` graph.

A layer is *local* when each value of its output depends on a bounded box of its input:
element-wise layers (activations, eval-mode batch norm and dropout) on the same box, sliding
windows (convolutions, pooling) on the box's image under their receptive field, and the sum,
difference or product of two same-shaped local activations (a residual connection) and
the concatenation of local activations along channels (an Inception or DenseNet block) on the
union of their boxes. ``unary``, ``binary`` and ``concatenated`` say what a graph node is as
such a layer, or None. The operations come from the engine's one table (``ops``).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, fx, nn

from methods.engine import ops

Ints = tuple[int, ...]
Layer = Callable[[Tensor], Tensor]
Combine = Callable[[Tensor, Tensor], Tensor]

# What incremental occlusion can box, from the engine's table of operations: element-wise
# layers and dropout as they are, sliding windows (convolutions, pooling) on boxes.
_POINTWISE_OPS = tuple(op for op in ops.OPS if op.local and op.kind in ("elementwise", "dropout"))
_POINTWISE_MODULES: tuple[type[nn.Module], ...] = tuple(
    m for op in _POINTWISE_OPS for m in op.modules
)
_POINTWISE_FUNCTIONS = frozenset(f for op in _POINTWISE_OPS if op.kind == "elementwise"
                                 for f in op.functions)  # fmt: skip
_POINTWISE_METHODS = frozenset(name for op in _POINTWISE_OPS for name in op.methods)
#: functional pooling calls, rebuilt as their module twins: the module, and the functional's
#: positional parameter names after the input (the orders differ, so arguments pass by name)
_FUNCTIONAL_POOLS: dict[Any, tuple[type[nn.Module], tuple[str, ...]]] = {
    op.functions[0]: (op.modules[0], op.signature)
    for op in ops.OPS
    if op.kind in ("max_pool", "pooling") and op.signature
}


@dataclass(frozen=True)
class Window:
    """A sliding-window layer on ``nd`` spatial dims, applied to pre-padded regions."""

    kernel: Ints
    stride: Ints
    dilation: Ints
    pad_lo: Ints
    pad_hi: Ints
    pad_value: float
    #: the layer with zero padding, for a region already padded with ``pad_value``
    apply: Layer

    def out_size(self, n_in: Ints) -> Ints:
        return tuple(
            (n + lo + hi - d * (k - 1) - 1) // s + 1
            for n, lo, hi, d, k, s in zip(
                n_in, self.pad_lo, self.pad_hi, self.dilation, self.kernel, self.stride,
                strict=True,
            )
        )  # fmt: skip

    def pad(self, t: Tensor) -> Tensor:
        pads = [v for lo, hi in zip(self.pad_lo, self.pad_hi, strict=True) for v in (lo, hi)]
        if not any(pads):
            return t
        # F.pad lists the last dim first
        flat = [v for i in range(len(self.pad_lo) - 1, -1, -1) for v in pads[2 * i : 2 * i + 2]]
        return F.pad(t, flat, value=self.pad_value)


@dataclass(frozen=True)
class LocalOp:
    """One layer of the local chain: ``dense`` runs it on whole tensors; ``window`` (None for
    element-wise layers) gives its sliding-window form for the input's spatial size."""

    dense: Layer
    window: Callable[[Ints], Window | None] | None


def _tuple(v: Any, nd: int) -> Ints:
    return tuple(int(a) for a in v) if isinstance(v, (tuple, list)) else (int(v),) * nd


def _conv(m: nn.Module, op: ops.Op) -> Callable[[Ints], Window | None] | None:
    nd = op.dims
    if m.padding_mode != "zeros" or getattr(m, "transposed", False):
        return None
    k, d = _tuple(m.kernel_size, nd), _tuple(m.dilation, nd)
    if m.padding == "same":
        total = tuple(di * (ki - 1) for di, ki in zip(d, k, strict=True))
        lo, hi = tuple(t // 2 for t in total), tuple(t - t // 2 for t in total)
    elif m.padding == "valid":
        lo = hi = (0,) * nd
    else:
        lo = hi = _tuple(m.padding, nd)
    fn = op.functions[0]
    w = Window(
        k, _tuple(m.stride, nd), d, lo, hi, 0.0,
        lambda r: fn(r, m.weight, m.bias, m.stride, 0, m.dilation, m.groups),
    )  # fmt: skip
    return lambda _: w


def _pool(m: nn.Module, op: ops.Op) -> Callable[[Ints], Window | None] | None:
    nd = op.dims
    if m.ceil_mode or getattr(m, "return_indices", False):
        return None
    k = _tuple(m.kernel_size, nd)
    s = _tuple(m.stride if m.stride is not None else m.kernel_size, nd)
    p = _tuple(m.padding, nd)
    if op.kind == "max_pool":
        fn = op.functions[0]
        d = _tuple(m.dilation, nd)
        w = Window(k, s, d, p, p, -math.inf, lambda r: fn(r, k, s, 0, d))
    else:
        if any(p) and not m.count_include_pad:
            return None  # edge divisors would count only the real elements
        fn = op.functions[0]
        extra = () if nd == 1 else (m.divisor_override,)
        w = Window(k, s, (1,) * nd, p, p, 0.0, lambda r: fn(r, k, s, 0, False, True, *extra))
    return lambda _: w


def _adaptive(m: nn.Module, op: ops.Op) -> Callable[[Ints], Window | None] | None:
    nd = op.dims
    if getattr(m, "return_indices", False):
        return None
    kind = "max" if op.name.startswith("adaptive_max") else "avg"
    fn = ops.BY_NAME[f"{kind}_pool{nd}d"].functions[0]  # the equivalent sliding window
    size = m.output_size if isinstance(m.output_size, (tuple, list)) else (m.output_size,) * nd

    def window(n_in: Ints) -> Window | None:
        outs = tuple(n if o is None else int(o) for o, n in zip(size, n_in, strict=True))
        if any(o < 1 or n % o for o, n in zip(outs, n_in, strict=True)):
            return None  # uneven bins overlap: not a plain sliding window
        k = tuple(n // o for o, n in zip(outs, n_in, strict=True))
        zero, one = (0,) * nd, (1,) * nd
        return Window(k, k, one, zero, zero, 0.0, lambda r: fn(r, k, k))

    return window


def module_op(m: nn.Module) -> LocalOp | None:
    if isinstance(m, _POINTWISE_MODULES):
        return LocalOp(m, None)
    if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
        return LocalOp(m, None)  # eval mode (checked by the caller): a per-channel affine map
    op = ops.of_module(m)
    # sliding windows by exact class: a subclass may compute something else in forward
    if op is None or not op.local or not op.dims or type(m) not in op.modules:
        return None
    make = _conv if op.kind == "weighted" else _adaptive if "adaptive" in op.name else _pool
    window = make(m, op)
    return None if window is None else LocalOp(m, window)


def _has_node(values: Any) -> bool:
    found = False

    def visit(a: Any) -> Any:
        nonlocal found
        found = found or isinstance(a, fx.Node)
        return a

    fx.node.map_aggregate(values, visit)
    return found


def _inplace(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    if node.op == "call_method":
        return str(node.target).endswith("_")
    return ops.is_inplace(node.target, dict(node.kwargs)) or node.target in _BINARY_INPLACE


def unary(gm: fx.GraphModule, node: fx.Node, src: fx.Node) -> LocalOp | None:
    """The node as a local layer reading only ``src``, or None.

    A layer that writes its input in place is local only when nothing else reads that input:
    on boxes, the write would miss the other readers' copies.
    """
    if _inplace(gm, node) and len(src.users) > 1:
        return None
    with_number = _with_number(node, src)
    if with_number is not None:
        return with_number
    if not node.args or node.args[0] is not src or _has_node((node.args[1:], node.kwargs)):
        return None
    rest, kw = node.args[1:], dict(node.kwargs)
    if node.op == "call_module":
        if rest or kw:
            return None
        return module_op(gm.get_submodule(str(node.target)))
    if node.op == "call_function" and node.target in _POINTWISE_FUNCTIONS:
        fn: Any = node.target
        return LocalOp(lambda t: fn(t, *rest, **kw), None)
    if node.op == "call_function" and node.target in _FUNCTIONAL_POOLS:
        cls, names = _FUNCTIONAL_POOLS[node.target]
        if len(rest) > len(names) or set(kw) & set(names[: len(rest)]):
            return None
        try:
            m = cls(**dict(zip(names, rest, strict=False)), **kw)
        except TypeError:
            return None
        return module_op(m)
    if node.op == "call_method" and node.target in _POINTWISE_METHODS:
        name = str(node.target)
        return LocalOp(lambda t: getattr(t, name)(*rest, **kw), None)
    return None


def _with_number(node: fx.Node, src: fx.Node) -> LocalOp | None:
    """``src + 2``, ``0.5 * src`` and the like: element-wise."""
    fn: Any = _arithmetic(node)
    if fn is None or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if a is src and isinstance(b, (int, float)) and not isinstance(b, bool):
        return LocalOp(lambda t: fn(t, b), None)
    if b is src and isinstance(a, (int, float)) and not isinstance(a, bool):
        return LocalOp(lambda t: fn(a, t), None)
    return None


def _arithmetic(node: fx.Node) -> Combine | None:
    if node.op == "call_function":
        return _ARITHMETIC.get(node.target) or _BINARY_INPLACE.get(node.target)
    if node.op == "call_method":
        return _ARITHMETIC_METHODS.get(str(node.target))
    return None


#: element-wise arithmetic, out of place (an in-place form computes the same values into its
#: first operand, which is local only when nothing else reads that operand)
_ARITHMETIC: dict[Any, Combine] = {
    operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
    torch.add: operator.add, torch.sub: operator.sub, torch.mul: operator.mul,
}  # fmt: skip
_BINARY_INPLACE: dict[Any, Combine] = {
    operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
}  # fmt: skip
_ARITHMETIC_METHODS: dict[str, Combine] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul,
    "add_": operator.add, "sub_": operator.sub, "mul_": operator.mul,
}  # fmt: skip


def binary(gm: fx.GraphModule, node: fx.Node) -> Combine | None:
    """The node as the sum, difference or product of its two node arguments, or None (the
    caller checks that both are local and, per call, that their shapes agree)."""
    if node.kwargs or len(node.args) != 2 or not all(isinstance(a, fx.Node) for a in node.args):
        return None
    fn = _arithmetic(node)
    first = node.args[0]
    if fn is None or (_inplace(gm, node) and len(first.users) > 1):  # type: ignore[union-attr]
        return None
    return fn


_CATS = (torch.cat, torch.concat, torch.concatenate)


def concatenated(node: fx.Node) -> tuple[list[fx.Node], int] | None:
    """``torch.cat(nodes, dim)``: the nodes and the dim (the caller checks, per call, that it
    is the channel dim), or None."""
    if node.op != "call_function" or node.target not in _CATS or not node.args:
        return None
    parts, rest, kw = node.args[0], node.args[1:], dict(node.kwargs)
    dim = rest[0] if rest else kw.pop("dim", kw.pop("axis", 0))
    if len(rest) > 1 or kw or not isinstance(dim, int) or not isinstance(parts, (list, tuple)):
        return None
    if not parts or not all(isinstance(p, fx.Node) for p in parts):
        return None
    return list(parts), dim
