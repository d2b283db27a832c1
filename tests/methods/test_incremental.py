"""Incremental occlusion (methods/engine/incremental.py) equals the plain path, everywhere.

Each model below runs occlusion twice: as is (the local chain at its input is recomputed box
by box) and wrapped in a plain function (which the incremental path cannot see into, so every
window is a full forward). The answers agree to float64 rounding for every layer kind the chain
knows, window placement, baseline and chunking; models the chain must not touch take the
plain path. Captum parity of occlusion (through this path) is in test_perturbation_parity.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import methods
from methods.engine import incremental, tracing


@pytest.fixture(autouse=True)
def _float64() -> Any:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _init(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return model.double().eval()


def _deep() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(2),
        nn.Conv2d(6, 6, 3, stride=2, padding=2, dilation=2), nn.BatchNorm2d(6), nn.GELU(),
        nn.AvgPool2d(3, stride=2, padding=1), nn.Flatten(), nn.Linear(6 * 2 * 2, 4),
    )  # fmt: skip


class _Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.conv2 = nn.Conv2d(4, 4, 3, padding="same", groups=2)
        self.fc = nn.Linear(4 * 9, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 3, 2, 1)
        x = F.adaptive_avg_pool2d(torch.tanh(self.conv2(x)), 3)  # 7x7 -> 3x3: uneven bins
        return self.fc(x.flatten(1))


def _one_d() -> nn.Module:
    return nn.Sequential(
        nn.Conv1d(4, 5, 5, padding=2), nn.ELU(), nn.MaxPool1d(2, stride=3),
        nn.AdaptiveMaxPool1d(5), nn.Flatten(), nn.Linear(25, 2),
    )  # fmt: skip


def _three_d() -> nn.Module:
    return nn.Sequential(
        nn.Conv3d(2, 3, 3, padding=1), nn.SiLU(), nn.AvgPool3d(2), nn.Flatten(),
        nn.Linear(3 * 3 * 4 * 4, 2),
    )  # fmt: skip


class _Residual(nn.Module):
    """A residual sum: boxed on the union of its operands' boxes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = h + self.conv2(h).relu()
        return self.fc(F.avg_pool2d(h, 2).flatten(1))


class _Scaled(nn.Module):
    """An additional forward argument reaches the tail."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, stride=2)
        self.fc = nn.Linear(2 * 3 * 3, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).sigmoid().flatten(1)) * scale


class _Bottleneck(nn.Module):
    """torchvision's ResNet block: in-place ReLUs, ``out += identity``, a strided shortcut."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c_in, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2, self.relu = nn.BatchNorm2d(width), nn.ReLU(inplace=True)
        self.conv3, self.bn3 = nn.Conv2d(width, 2 * width, 1, bias=False), nn.BatchNorm2d(2 * width)
        self.downsample = (
            nn.Sequential(nn.Conv2d(c_in, 2 * width, 1, stride=stride), nn.BatchNorm2d(2 * width))
            if stride != 1 or c_in != 2 * width
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        out += identity
        return self.relu(out)


def _resnet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
        _Bottleneck(4, 2, 1), _Bottleneck(4, 2, 1), _Bottleneck(4, 3, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 3),
    )  # fmt: skip


class _Branches(nn.Module):
    """Branches joined by a product, a difference and arithmetic with numbers; an in-place
    ReLU whose input is read again (so it cannot be boxed: the rest is the tail)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 5, padding=2)
        self.c = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.a(x)) * (0.5 * self.b(x)).sigmoid()
        h = F.max_pool2d(h - 1, 2) + F.max_pool2d(h, 2)
        h = 2 - self.c(h + h)
        g = F.relu(h, inplace=True)  # writes h, which is read again below
        return self.fc(F.avg_pool2d(g + h, 2).flatten(1))


class _Inception(nn.Module):
    """Branches joined along channels (an Inception block, then a DenseNet-style growth);
    a concatenation along a spatial dim ends what can be boxed."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 2, 1), nn.Conv2d(3, 3, 3, padding=1)
        self.c = nn.Conv2d(8, 2, 3, padding=1)
        self.fc = nn.Linear(10 * 4 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.cat([self.a(x), F.relu(self.b(x)), F.max_pool2d(x, 3, 1, 1)], 1)
        h = F.avg_pool2d(torch.cat((h, self.c(h)), dim=1), 4)
        h = torch.cat([h, torch.tanh(h)], dim=-1)  # 4x4 -> 4x8: spatial
        return self.fc(h.flatten(1))


def _fully_conv() -> nn.Module:
    """Every layer is local: the tail is the identity and targets index a 4-D output."""
    return nn.Sequential(nn.Conv2d(3, 2, 3), nn.Hardtanh(), nn.MaxPool2d(2, padding=1))


Model = Callable[[], nn.Module]
CASES: list[tuple[str, Model, tuple[int, ...], dict[str, Any]]] = [
    ("deep", _deep, (3, 16, 16), {"target": 1}),
    ("functional", _Functional, (3, 16, 16), {"target": [0, 2, 1]}),
    ("one_d", _one_d, (4, 30), {"target": 1}),
    ("three_d", _three_d, (2, 6, 8, 8), {"target": 0}),
    ("residual", _Residual, (3, 16, 16), {"target": 2}),
    ("resnet", _resnet, (3, 16, 16), {"target": 1}),
    ("branches", _Branches, (3, 16, 16), {"target": 0}),
    ("inception", _Inception, (3, 16, 16), {"target": 2}),
    ("fully_conv", _fully_conv, (3, 9, 9), {"target": (1, 2, 3)}),
]
WINDOWS: dict[int, list[tuple[Any, Any]]] = {
    2: [((4, 3), 1), ((2, 4), (2, 3)), ((4, 7), (1, 5))],
    3: [((3, 4, 4), 2), ((1, 5, 3), (1, 3, 2)), ((3, 5, 5), (3, 4, 4)), ((2, 7, 7), (1, 5, 5))],
    4: [((2, 2, 3, 3), (1, 1, 2, 2)), ((1, 6, 2, 5), (1, 1, 2, 3))],
}


def _plain(model: nn.Module) -> Callable[..., torch.Tensor]:
    return lambda *args: model(*args)


def _both(model: nn.Module, x: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    fast = methods.attribute(model, x, "occlusion", **kw).attributions
    slow = methods.attribute(_plain(model), x, "occlusion", **kw).attributions
    return fast, slow


def _pairwise(shape: tuple[int, ...], g: torch.Generator) -> list[dict[str, Any]]:
    """Every (baselines, perturbations_per_eval) pair, each with a window in turn: every pair of
    the three options meets once, every window is used, in a third of the full product."""
    bases = (None, 0.5, torch.randn(1, *shape, generator=g))
    windows = WINDOWS[len(shape)]
    return [
        {"sliding_window_shapes": w, "strides": s, "baselines": b, "perturbations_per_eval": ppe}
        for k, (b, ppe) in enumerate((b, ppe) for b in bases for ppe in (1, 4, None))
        for w, s in [windows[k % len(windows)]]
    ]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name,make,shape,kw", CASES, ids=[c[0] for c in CASES])
def test_equals_the_plain_path(
    name: str,
    make: Model,
    shape: tuple[int, ...],
    kw: dict[str, Any],
    dtype: torch.dtype,
    monkeypatch: Any,
) -> None:
    model = _init(make()).to(dtype)
    assert incremental.local_graph(model, torch.zeros(1, *shape, dtype=dtype)) is not None
    used = []
    rows = incremental._Plan.rows
    monkeypatch.setattr(incremental._Plan, "rows", lambda *a: used.append(1) or rows(*a))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, *shape, generator=g).to(dtype)
    # float32: the two paths sum in different orders; float64 pins the arithmetic itself
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    for case in _pairwise(shape, g):
        if isinstance(case["baselines"], torch.Tensor):
            case["baselines"] = case["baselines"].to(dtype)
        res = methods.attribute(model, x, "occlusion", **case, **kw)
        slow = methods.attribute(_plain(model), x, "occlusion", **case, **kw)
        torch.testing.assert_close(res.attributions, slow.attributions, **tol)
        assert slow.params["strategy"] == "plain"
    assert used, "the incremental path was never taken"
    assert res.params["strategy"] == "incremental"


def test_additional_forward_args_reach_the_tail() -> None:
    model = _init(_Scaled())
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    scale = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]])
    fast, slow = _both(
        model, x, target=2, additional_forward_args=(scale,), sliding_window_shapes=(3, 3, 3),
        strides=2, perturbations_per_eval=3,
    )  # fmt: skip
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_inputs_and_model_are_left_alone() -> None:
    model = _init(_deep())  # in-place ReLU inside the chain
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    before = x.clone()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    methods.attribute(model, x, "occlusion", target=0, sliding_window_shapes=(3, 4, 4), strides=4)
    assert torch.equal(x, before)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())


def _not_local_after_all(model: nn.Module) -> None:
    assert incremental.local_graph(model, torch.zeros(1, *(3, 16, 16))) is None


@pytest.mark.parametrize(
    "make",
    [
        lambda: _deep().train(),  # batch norm uses batch statistics
        lambda: nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 2)),  # no local layer first
        lambda: nn.Sequential(nn.Conv2d(3, 2, 3, padding=1, padding_mode="reflect"), nn.Flatten()),
        lambda: nn.Sequential(nn.MaxPool2d(2, ceil_mode=True), nn.Flatten()),
        lambda: nn.Sequential(nn.AvgPool2d(3, padding=1, count_include_pad=False), nn.Flatten()),
    ],
    ids=["training", "dense_first", "reflect_padding", "ceil_mode", "exclude_pad"],
)
def test_models_that_take_the_plain_path(make: Model) -> None:
    model = make().double()
    if not any(m.training for m in model.modules()):
        model.eval()
    _not_local_after_all(model)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(4))
    fast, slow = _both(model, x, target=0, sliding_window_shapes=(3, 2, 2), strides=2)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_hooks_and_untraceable_forwards_take_the_plain_path() -> None:
    model = _init(_deep())
    handle = model[0].register_forward_hook(lambda m, i, o: None)
    _not_local_after_all(model)
    handle.remove()
    assert incremental.local_graph(model, torch.zeros(1, *(3, 16, 16))) is not None

    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 2, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
                x = -x
            return self.conv(x).flatten(1)

    _not_local_after_all(Branchy())


def test_a_replaced_layer_is_seen() -> None:
    model = _init(_deep())
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))
    kw: dict[str, Any] = {"target": 1, "sliding_window_shapes": (3, 4, 4), "strides": 4}
    methods.attribute(model, x, "occlusion", **kw)
    model[3] = _init(nn.Conv2d(6, 6, 3, stride=2, padding=2, dilation=2), seed=9)
    fast, slow = _both(model, x, **kw)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_a_window_covering_everything_takes_the_plain_path(monkeypatch: Any) -> None:
    model = _init(_deep())
    monkeypatch.setattr(incremental._Plan, "rows", None)  # would fail if called
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(6))
    methods.attribute(model, x, "occlusion", target=1, sliding_window_shapes=(3, 16, 16))


class _Switch(nn.Module):
    """A flag read in forward: the traced graph depends on it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        self.fc = nn.Linear(2 * 8 * 8, 2)
        self.negate = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x).relu()
        return self.fc((-h if self.negate else h).flatten(1))


def test_a_flag_read_in_forward_is_seen() -> None:
    model = _init(_Switch())
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    kw: dict[str, Any] = {"target": 1, "sliding_window_shapes": (3, 2, 2), "strides": 2}
    methods.attribute(model, x, "occlusion", **kw)
    model.negate = True
    fast, slow = _both(model, x, **kw)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_a_tail_starting_in_place_runs() -> None:
    model = _init(nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.Flatten(), nn.ReLU(inplace=True), nn.Linear(72, 3),
    ))  # fmt: skip
    x = torch.randn(2, 1, 8, 8, generator=torch.Generator().manual_seed(8))
    fast, slow = _both(model, x, target=0, sliding_window_shapes=(1, 3, 3))
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


class _PositionalPools(nn.Module):
    """Functional pools with positional arguments, whose order differs from the modules'."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.fc = nn.Linear(3 * 3 * 3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(self.conv(x), 2, 2, 0, 1, False)  # ceil_mode=False by position
        h = F.avg_pool2d(h, 3, 1, 1, False, True)  # count_include_pad=True by position
        return self.fc(F.adaptive_avg_pool2d(h, 3).flatten(1))


def test_functional_pools_with_positional_arguments() -> None:
    model = _init(_PositionalPools())
    assert incremental.local_graph(model, torch.zeros(1, *(3, 16, 16))) is not None
    x = torch.randn(2, 2, 12, 12, generator=torch.Generator().manual_seed(9))
    fast, slow = _both(model, x, target=1, sliding_window_shapes=(2, 3, 3), strides=2)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)


def test_a_hugging_face_resnet_is_boxed_through_its_residual_stages() -> None:
    """Hugging Face's ResNet branches on the input's shape, which plain ``torch.fx`` cannot
    follow: it is traced per input shape. The wrapper around it is in training mode, as a
    wrapper built around an eval-mode model is."""
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig(embedding_size=4, hidden_sizes=[4, 6, 8, 8], depths=[1, 2, 1, 1],
                       layer_type="bottleneck", num_labels=3)  # fmt: skip
    hf = _init(ResNetForImageClassification(cfg))

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = hf

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits

    model = Logits()
    assert model.training
    g = torch.Generator().manual_seed(10)
    for size in (32, 40):  # a second shape gets its own trace
        x = torch.randn(2, 3, size, size, generator=g)
        graph = incremental.local_graph(model, x)
        assert graph is not None
        assert any(n.combine is not None for n in graph.nodes[: max(graph.cuts) + 1])
        kw: dict[str, Any] = {"target": 1, "sliding_window_shapes": (3, 8, 8), "strides": 8}
        res = methods.attribute(model, x, "occlusion", **kw)
        assert res.params["strategy"] == "incremental"
        slow = methods.attribute(_plain(model), x, "occlusion", **kw).attributions
        torch.testing.assert_close(res.attributions, slow, rtol=1e-10, atol=1e-12)


def test_an_analysis_that_fails_takes_the_plain_path(monkeypatch: Any) -> None:
    def broken(*_: Any) -> None:
        raise RuntimeError("a layer the analysis did not foresee")

    monkeypatch.setattr(incremental._Plan, "__init__", broken)
    model = _init(_resnet())
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(11))
    kw: dict[str, Any] = {"target": 1, "sliding_window_shapes": (3, 4, 4), "strides": 4}
    res = methods.attribute(model, x, "occlusion", **kw)
    assert res.params["strategy"] == "plain"
    slow = methods.attribute(_plain(model), x, "occlusion", **kw).attributions
    torch.testing.assert_close(res.attributions, slow, rtol=0, atol=0)


def test_forwards_in_other_threads_run_while_a_model_is_traced() -> None:
    """torch.fx patches nn.Module process-wide while it traces: a forward in another thread
    failed with NameError ("module is not installed as a submodule") or was recorded into the
    graph. Both traces leave other threads' forwards, of this model or another, as they are."""
    torch.manual_seed(0)
    traced = nn.Sequential(*[nn.Linear(8, 8) for _ in range(100)])
    other = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.rand(2, 8)
    want = {id(m): m(x) for m in (traced, other)}
    seen: list[str] = []
    done = threading.Event()

    def forwards() -> None:
        while not done.is_set():
            for m in (other, traced):
                try:
                    y = m(x)
                    ok = isinstance(y, torch.Tensor) and torch.equal(y, want[id(m)])
                    seen.append("ok" if ok else f"wrong: {type(y).__name__}")
                except Exception as exc:  # what the patched call raised
                    seen.append(repr(exc))

    thread = threading.Thread(target=forwards)
    thread.start()
    try:
        for _ in range(5):
            assert tracing.trace(traced) is not None
            assert tracing.trace_at(traced, x) is not None
    finally:
        done.set()
        thread.join()
    assert seen and set(seen) == {"ok"}, sorted(set(seen))[:3]
