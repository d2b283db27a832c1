"""The autograd-free backward of layer chains (methods/engine/chain.py) equals autograd exactly.

Every layer kind the chain knows is checked bit for bit (``torch.equal``) against
``torch.autograd.grad`` in float32 and float64, directly and through ``methods.attribute``
(where a plain function wrapping the model forces autograd). Models that are not plain
chains, or inputs a link does not expect, must take autograd.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import methods
from methods.engine import chain
from methods.engine.inputs import Forward
from methods.engine.targets import make_target


class _Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(F.relu(self.a(x)).sigmoid()))


class _Flattens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, start_dim=1))


Case = tuple[str, Callable[[], nn.Module], tuple[int, ...]]
CASES: list[Case] = [
    ("mlp_relu", lambda: nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), (6,)),
    ("mlp_acts", lambda: nn.Sequential(
        nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8),
        nn.GELU("tanh"), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 8), nn.Sigmoid(),
        nn.Dropout(0.5), nn.Linear(8, 8), nn.Tanh(), nn.Identity(), nn.Linear(8, 3, bias=False),
    ), (6,)),
    ("nested", lambda: nn.Sequential(
        nn.Sequential(nn.Linear(6, 8), nn.ReLU()), nn.Sequential(nn.Linear(8, 3)),
    ), (6,)),
    ("cnn", lambda: nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 4, 3, stride=2, padding=2, dilation=2, groups=2), nn.ReLU(),
        nn.AvgPool2d(2, stride=1), nn.Flatten(), nn.Linear(4 * 2 * 2, 3),
    ), (2, 12, 12)),
    ("pools", lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3, bias=False), nn.MaxPool2d(3, stride=2, padding=1, dilation=1,
                                                     ceil_mode=True),
        nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False), nn.Tanh(),
        nn.AvgPool2d(2, ceil_mode=True, divisor_override=3), nn.AdaptiveAvgPool2d(3),
        nn.Flatten(), nn.Linear(27, 2),
    ), (2, 13, 13)),
    ("global_pool", lambda: nn.Sequential(
        nn.Conv2d(2, 5, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(5, 3),
    ), (2, 9, 9)),
    ("dilated_max", lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.MaxPool2d(2, dilation=2), nn.Flatten(1, 3), nn.Linear(3 * 5 * 5, 2),
    ), (2, 13, 13)),
    ("conv1d", lambda: nn.Sequential(
        nn.Conv1d(3, 4, 5, padding=2, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8, 2),
    ), (3, 16)),
    ("conv3d", lambda: nn.Sequential(
        nn.Conv3d(2, 2, 3, padding=1), nn.Sigmoid(), nn.Flatten(), nn.Linear(2 * 4 * 5 * 5, 2),
    ), (2, 4, 5, 5)),
    ("flatten_dims", lambda: nn.Sequential(
        nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Flatten(1, 2), nn.Flatten(), nn.Linear(3 * 4 * 4, 2),
    ), (2, 6, 6)),
]  # fmt: skip
TARGETS: list[Any] = [1, [0, 1, 1, 0], (1,)]


def _init(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return model.to(dtype).eval()


def _autograd(model: nn.Module, x: torch.Tensor, target: Any) -> torch.Tensor:
    leaf = x.detach().requires_grad_(True)
    out = model(leaf)
    t = make_target(target, x.shape[0])
    (grad,) = torch.autograd.grad(t.select(out).sum(), leaf)
    return grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,make,shape", CASES, ids=[c[0] for c in CASES])
def test_bit_for_bit_with_autograd(
    name: str, make: Callable[[], nn.Module], shape: tuple[int, ...], dtype: torch.dtype
) -> None:
    model = _init(make(), dtype)
    x = torch.randn(4, *shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    links = chain.links(Forward(model), (x,))
    assert links is not None, "the model should be recognised as a chain"
    for target in TARGETS:
        done = chain.backward(links, x, make_target(target, 4))
        assert done is not None
        assert torch.equal(done[0], _autograd(model, x, target))
        assert torch.equal(done[1], model(x))
    for method in ("saliency", "input_x_gradient", "integrated_gradients"):
        ours = methods.attribute(model, x, method, target=1).attributions
        plain = methods.attribute(lambda t: model(t), x, method, target=1).attributions
        assert torch.equal(ours, plain), method


def test_caller_model_is_untouched() -> None:
    model = _init(CASES[3][1](), torch.float32)
    x = torch.randn(2, 2, 12, 12)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    methods.attribute(model, x, "saliency", target=0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert all(p.requires_grad for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())
    assert not x.requires_grad


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + x


class _TwoArgs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        return self.a(x) * scale


@pytest.mark.parametrize(
    "make",
    [
        _Residual,
        _TwoArgs,
        lambda: nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2)),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train(),
        lambda: nn.Sequential(nn.Linear(4, 4), nn.Softmax(dim=1)),
        lambda: _Functional(),  # a custom forward: only stock containers qualify
        lambda: _Flattens(),
    ],
    ids=[
        "residual",
        "two_args",
        "batch_norm",
        "training",
        "softmax",
        "custom_forward",
        "flatten_call",
    ],
)
def test_other_models_take_autograd(make: Callable[[], nn.Module]) -> None:
    model = make()
    if not any(m.training for m in list(model.modules())[1:]):
        model.eval()
    assert chain.links(Forward(model), (torch.randn(3, 4),)) is None


def test_hooks_and_function_modes_take_autograd() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.randn(3, 4)
    assert chain.links(Forward(model), (x,)) is not None
    seen: list[torch.Tensor] = []
    handle = model[1].register_forward_hook(lambda m, i, o: seen.append(o))
    assert chain.links(Forward(model), (x,)) is None
    methods.attribute(model, x, "saliency", target=0)
    assert len(seen) == 1  # the hook saw the whole forward, as with any model
    handle.remove()
    with _PassThrough():
        assert chain.links(Forward(model), (x,)) is None


class _PassThrough(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_unexpected_ranks_fall_back_to_autograd() -> None:
    model = _init(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)), torch.float64)
    x = torch.randn(3, 6, 4, dtype=torch.float64)  # Linear on 3-D input: not a chain case
    links = chain.links(Forward(model), (x,))
    assert links is not None and chain.backward(links, x, make_target((0, 1), 3)) is None
    ours = methods.attribute(model, x, "saliency", target=(0, 1)).attributions
    plain = methods.attribute(lambda t: model(t), x, "saliency", target=(0, 1)).attributions
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("name,make,shape", CASES[:4], ids=[c[0] for c in CASES[:4]])
def test_perturbation_forwards_replay_the_chain_exactly(
    name: str, make: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    model = _init(make(), torch.float32)
    x = torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))
    assert isinstance(chain.replayed(Forward(model)).fn, chain.Replay)
    for method in ("feature_ablation", "shapley_value_sampling"):
        kw: dict[str, Any] = {"target": 1, "seed": 0} if method != "feature_ablation" else {}
        kw.setdefault("target", 1)
        ours = methods.attribute(model, x, method, **kw).attributions
        plain = methods.attribute(lambda t: model(t), x, method, **kw).attributions
        assert torch.equal(ours, plain), method


def test_layer_settings_are_read_at_every_call() -> None:
    model = _init(nn.Sequential(nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 2)), torch.float64)
    x = torch.randn(3, 4, dtype=torch.float64)
    methods.attribute(model, x, "saliency", target=0)  # analysed and cached
    model[1].negative_slope = 0.7
    ours = methods.attribute(model, x, "saliency", target=0).attributions
    plain = methods.attribute(lambda t: model(t), x, "saliency", target=0).attributions
    assert torch.equal(ours, plain)
    model[1] = nn.Tanh()  # a replaced layer is seen too
    ours = methods.attribute(model, x, "saliency", target=0).attributions
    plain = methods.attribute(lambda t: model(t), x, "saliency", target=0).attributions
    assert torch.equal(ours, plain)


@pytest.mark.parametrize("method", ["saliency", "feature_ablation", "occlusion"])
def test_models_are_not_kept_alive(method: str) -> None:
    import gc
    import weakref

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3))
    model.eval()
    kw: dict[str, Any] = {"sliding_window_shapes": (1, 2, 2)} if method == "occlusion" else {}
    methods.attribute(model, torch.randn(2, 1, 6, 6), method, target=0, **kw)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def test_replaced_forward_or_backward_pre_hooks_take_autograd() -> None:
    model = _init(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), torch.float64)
    x = torch.randn(4, 6, dtype=torch.float64)
    orig = model.forward
    model.forward = lambda t: orig(t) * 2  # type: ignore[method-assign]
    assert chain.links(Forward(model), (x,)) is None
    for method in ("saliency", "feature_ablation"):
        ours = methods.attribute(model, x, method, target=0).attributions
        plain = methods.attribute(lambda t: model(t), x, method, target=0).attributions
        assert torch.equal(ours, plain), method
    del model.forward
    assert chain.links(Forward(model), (x,)) is not None
    hook = nn.modules.module.register_module_full_backward_pre_hook(lambda m, g: g)
    try:
        assert chain.links(Forward(model), (x,)) is None
    finally:
        hook.remove()


def test_column_major_inputs_match_autograd_bit_for_bit() -> None:
    model = _init(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)), torch.float32)
    x = torch.randn(6, 4).t()  # column-major, as from a Fortran-order numpy array
    for target in (0, [0, 1, 2, 0]):
        done = chain.backward(chain.links(Forward(model), (x,)) or (), x, make_target(target, 4))
        assert done is not None and torch.equal(done[0], _autograd(model, x, target))
