"""Input gradients of layer chains without the autograd engine, bit for bit as autograd.

On a small model the autograd engine's fixed cost per backward (recording the graph, then
scheduling its nodes) is larger than the arithmetic: for a 20-64-64-3 MLP the backward costs
several times the forward here. A model that is a stock ``nn.Sequential`` (nested ones too)
of known layers (MLPs, VGG-style CNNs) is instead run layer by layer under ``no_grad``,
keeping what each layer's backward reads, and its input gradient is built by calling, in
reverse, the very kernels autograd would call for that layer (aten's ``threshold_backward``,
``convolution_backward``, ``max_pool2d_with_indices_backward``, ...) with the same arguments.
The numbers are autograd's exactly; tests compare them with ``torch.equal`` for every layer
kind. Only stock containers qualify: a custom ``forward`` may hold Python (a flag, a side
effect) that replaying its layers would skip. Any other model, or input or layer setting the
chain does not expect, takes autograd (``backward`` returns None).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from methods.engine import tracing
from methods.engine.batching import counting_saved_bytes
from methods.engine.inputs import Forward
from methods.engine.targets import Target

aten = torch.ops.aten

#: forward(x) -> (y, saved); backward(grad_y, x, y, saved) -> grad_x
Fwd = Callable[[Tensor], tuple[Tensor, Any]]
Bwd = Callable[[Tensor, Tensor, Tensor, Any], Tensor]


@dataclass(frozen=True)
class _Link:
    forward: Fwd
    backward: Bwd
    #: input ranks the link's forward/backward pair reproduces autograd for (None: any)
    ranks: tuple[int, ...] | None = None
    #: the layer's value alone, when cheaper than ``forward`` (which keeps what backward needs)
    value: Callable[[Tensor], Tensor] | None = None
    #: whether the layer's current settings are ones the link reproduces (checked per call)
    usable: Callable[[], bool] | None = None
    #: whether ``backward`` reads the layer's input, its output (others are freed early)
    reads: tuple[bool, bool] = (True, True)

    def fits(self, x: Tensor) -> bool:
        if self.ranks is not None and x.dim() not in self.ranks:
            return False
        return self.usable is None or self.usable()

    def __call__(self, x: Tensor) -> Tensor:
        return self.value(x) if self.value is not None else self.forward(x)[0]


def _pointwise(
    fn: Callable[[Tensor], Tensor], bwd: Bwd, reads: tuple[bool, bool] = (True, False)
) -> _Link:
    return _Link(lambda x: (fn(x), None), bwd, value=fn, reads=reads)


def _linear(m: nn.Linear) -> _Link:
    # 2-D input: addmm (or mm). Autograd's input gradient (mm_mat1_backward) is
    # grad.mm(weight), or weight.t().mm(grad.t()).t() for a column-major input: so is ours.
    def fwd(x: Tensor) -> tuple[Tensor, Any]:
        column_major = x.stride(0) == 1 and x.stride(1) == x.shape[0]
        return F.linear(x, m.weight, m.bias), column_major

    def bwd(g: Tensor, x: Tensor, y: Tensor, column_major: bool) -> Tensor:
        return m.weight.t().mm(g.t()).t() if column_major else g.mm(m.weight)

    return _Link(
        fwd,
        bwd,
        ranks=(2,),
        value=lambda x: F.linear(x, m.weight, m.bias),
        reads=(False, False),
    )


def _conv(m: Any, nd: int) -> _Link:
    def bwd(g: Tensor, x: Tensor, y: Tensor, s: Any) -> Tensor:
        bias = None if m.bias is None else [int(m.bias.shape[0])]
        out: Tensor = aten.convolution_backward(
            g, x, m.weight, bias, list(m.stride), list(m.padding), list(m.dilation), False,
            [0] * nd, m.groups, [True, False, False],
        )[0]  # fmt: skip
        return out

    return _Link(
        lambda x: (m(x), None), bwd, ranks=(nd + 2,), reads=(True, False),
        usable=lambda: m.padding_mode == "zeros" and not isinstance(m.padding, str),
    )  # fmt: skip


def _max_pool2d(m: nn.MaxPool2d) -> _Link:
    def args() -> list[Any]:
        return [_pair(m.kernel_size), _pair(m.stride or m.kernel_size), _pair(m.padding),
                _pair(m.dilation), bool(m.ceil_mode)]  # fmt: skip

    def fwd(x: Tensor) -> tuple[Tensor, Any]:
        y, idx = aten.max_pool2d_with_indices(x, *args())
        return y, idx

    return _Link(
        fwd, lambda g, x, y, idx: aten.max_pool2d_with_indices_backward(g, x, *args(), idx),
        ranks=(4,), value=m, usable=lambda: not m.return_indices, reads=(True, False),
    )  # fmt: skip


def _avg_pool2d(m: nn.AvgPool2d) -> _Link:
    def args() -> list[Any]:
        return [_pair(m.kernel_size), _pair(m.stride or m.kernel_size), _pair(m.padding),
                bool(m.ceil_mode), bool(m.count_include_pad), m.divisor_override]  # fmt: skip

    return _Link(
        lambda x: (aten.avg_pool2d(x, *args()), None),
        lambda g, x, y, s: aten.avg_pool2d_backward(g, x, *args()),
        ranks=(4,),
        reads=(True, False),
    )


def _adaptive_avg_pool2d(m: nn.AdaptiveAvgPool2d) -> _Link:
    def fwd(x: Tensor) -> tuple[Tensor, Any]:
        out = F.adaptive_avg_pool2d(x, m.output_size)
        if tuple(out.shape[-2:]) == (1, 1):
            return out, None  # torch computes a mean over H and W here (and so its backward)
        return out, ()

    def bwd(g: Tensor, x: Tensor, y: Tensor, s: Any) -> Tensor:
        if s is None:
            return g.expand(x.shape) / math.prod(x.shape[-2:])
        out: Tensor = aten._adaptive_avg_pool2d_backward(g, x)
        return out

    return _Link(fwd, bwd, ranks=(4,), reads=(True, False))


def _pair(v: Any) -> list[int]:
    return [int(a) for a in v] if isinstance(v, (tuple, list)) else [int(v)] * 2


_IDENTITY = _Link(lambda x: (x, None), lambda g, x, y, s: g, reads=(False, False))
_OUT = (False, True)  # backward reads the output only
_RELU = _pointwise(torch.relu, lambda g, x, y, s: aten.threshold_backward(g, y, 0), _OUT)
_SIGMOID = _pointwise(torch.sigmoid, lambda g, x, y, s: aten.sigmoid_backward(g, y), _OUT)
_TANH = _pointwise(torch.tanh, lambda g, x, y, s: aten.tanh_backward(g, y), _OUT)


def _module_link(m: Any) -> _Link | None:
    """The link for one standard layer; its settings are read at every call, never copied."""
    if type(m) in (nn.Identity, nn.Dropout):  # Dropout: eval mode (see tracing)
        return _IDENTITY
    if type(m) is nn.ReLU:
        return _RELU
    if type(m) is nn.Sigmoid:
        return _SIGMOID
    if type(m) is nn.Tanh:
        return _TANH
    if type(m) is nn.LeakyReLU:
        return _pointwise(
            lambda x: F.leaky_relu(x, m.negative_slope),
            lambda g, x, y, s: aten.leaky_relu_backward(g, x, m.negative_slope, False),
        )
    if type(m) is nn.GELU:
        return _pointwise(
            lambda x: F.gelu(x, approximate=m.approximate),
            lambda g, x, y, s: aten.gelu_backward(g, x, approximate=m.approximate),
        )
    if type(m) is nn.SiLU:
        return _pointwise(F.silu, lambda g, x, y, s: aten.silu_backward(g, x))
    if type(m) is nn.Flatten:
        return _Link(
            lambda x: (x.flatten(m.start_dim, m.end_dim), x.shape),
            lambda g, x, y, shape: g.reshape(shape),
            reads=(False, False),
        )
    if type(m) is nn.Linear:
        return _linear(m)
    if type(m) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
        return _conv(m, int(type(m).__name__[-2]))
    if type(m) is nn.MaxPool2d:
        return _max_pool2d(m)
    if type(m) is nn.AvgPool2d:
        return _avg_pool2d(m)
    if type(m) is nn.AdaptiveAvgPool2d:
        return _adaptive_avg_pool2d(m)
    return None


def _layers(model: nn.Module) -> list[nn.Module] | None:
    """The leaf layers a stock ``nn.Sequential`` (possibly nested) runs, in order; None for any
    other module. Only torch's own code runs between them, so nothing the caller can change
    (a flag read in a custom ``forward``) can make a cached chain stale."""
    if type(model).forward is not nn.Sequential.forward or not isinstance(model, nn.Sequential):
        return None
    out: list[nn.Module] = []
    for m in model:
        inner = _layers(m) if isinstance(m, nn.Sequential) else [m]
        if inner is None:
            return None
        out.extend(inner)
    return out


def _analyse(model: nn.Module) -> tuple[_Link, ...] | None:
    layers = _layers(model)
    if not layers:
        return None
    links = []
    for m in layers:
        link = _module_link(m)
        if link is None:
            return None
        links.append(link)
    return tuple(links)


_CHAINS: tracing.Cache = weakref.WeakKeyDictionary()


def _function_mode_active() -> bool:
    """Whether a ``TorchFunctionMode`` is active. torch has no public query for this; the one
    private call sits here, and if a release drops it we assume a mode is active, which only
    costs speed (autograd runs instead of the chain), never correctness."""
    probe = getattr(torch._C, "_is_torch_function_mode_enabled", None)
    return True if probe is None else bool(probe())


def links(forward: Forward, xs: tuple[Tensor, ...]) -> tuple[_Link, ...] | None:
    """The model's chain when this call can take it, else None."""
    if forward.args or len(xs) != 1 or not xs[0].is_floating_point():
        return None
    if _function_mode_active():
        return None  # a mode (ours for DeepLift, or the caller's) must see autograd run
    if counting_saved_bytes():
        return None  # a memory measurement counts what autograd saves
    return tracing.analysed(_CHAINS, forward.fn, _analyse)


class Replay:
    """The model as its chain of layers, called directly (see ``replayed``)."""

    def __init__(self, model: Any, chain: tuple[_Link, ...]) -> None:
        self.model, self.chain = model, chain

    def __call__(self, *xs: Tensor) -> Any:
        if len(xs) != 1:
            return self.model(*xs)
        t = xs[0]
        for link in self.chain:
            if not link.fits(t):
                return self.model(*xs)  # an input or setting no link expects: the model decides
            t = link(t)
        return t


def replayed(forward: Forward) -> Forward:
    """``forward`` running the model's chain of layers directly, when it is one: the same ops
    without ``nn.Module`` call overhead, for the many small forwards of perturbation methods."""
    if forward.args or _function_mode_active():
        return forward
    chain = tracing.analysed(_CHAINS, forward.fn, _analyse)
    return forward if chain is None else Forward(Replay(forward.fn, chain))


def backward(chain: tuple[_Link, ...], x: Tensor, target: Target) -> tuple[Tensor, Tensor] | None:
    """(d(sum of targeted outputs)/dx, the model output), or None to use autograd."""
    with torch.no_grad():
        acts: list[Tensor | None] = [x]
        saved: list[Any] = []
        t, reads_output = x, True
        for link in chain:
            if not link.fits(t):
                return None
            try:
                y, s = link.forward(t)
            except torch.OutOfMemoryError:
                raise
            except Exception:  # the model fails on this input: autograd reports it as usual
                return None
            if not link.reads[0] and not reads_output:
                acts[-1] = None  # no backward reads it: free it now, as autograd would
            acts.append(y)
            saved.append(s)
            t, reads_output = y, link.reads[1]
        g = target.cotangent(y)
        # Popping frees each activation once used, as autograd does: the allocator then
        # hands warm memory to what follows (keeping all measured ~1.5x slower on a CNN).
        for link in reversed(chain):
            out, s = acts.pop(), saved.pop()
            g = link.backward(g, acts[-1], out, s)  # type: ignore[arg-type]
            del out, s
    return g, y
