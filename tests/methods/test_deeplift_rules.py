"""DeepLift's softmax and max rules: per example, complete to rounding, Captum where it is right.

Captum 0.9.0 centres softmax multipliers over the whole doubled batch (examples depend on each
other and on ``internal_batch_size``; completeness fails) and its max rule keeps one of several
windows sharing an argmax (completeness fails where windows overlap). Ours fixes both; see
README "Where we differ from Captum, on purpose". The softmax rule is checked against a slow,
literal per-row reference (``literal_softmax_multipliers``), also used by the parity suites.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from captum.attr import DeepLift
from captum.attr._core import deep_lift as captum_deep_lift
from torch import Tensor, nn

import methods

#: every test twice, channels-last (rounded as another CPU would) and as given (conftest)
pytestmark = pytest.mark.usefixtures("both_layouts")

F64 = torch.float64
SEEDS = [0, 1, 2]


def literal_softmax_multipliers(x: Tensor, xb: Tensor, g: Tensor) -> list[float]:
    """Rescale through softmax(x) = exp(z), z = x - log(sum(exp(x))), for one example (1-D).

    Slow and literal: every multiplier is a ratio of differences, chained by hand.
    """
    n = len(x)
    lse, lse_b = float(torch.logsumexp(x, 0)), float(torch.logsumexp(xb, 0))
    e = [math.exp(float(v) - lse) for v in x]  # exp(x) / S: scale-free, like the ratios below
    eb = [math.exp(float(v) - lse) for v in xb]
    s, sb = sum(e), sum(eb)  # s == 1
    dlse = lse - lse_b
    log_mean = (s - sb) / (math.log(s) - math.log(sb)) if abs(dlse) > 1e-10 else (s + sb) / 2
    w = []  # multipliers of log-sum-exp w.r.t. each x_k
    for k in range(n):
        dxk = float(x[k] - xb[k])
        rho = (e[k] - eb[k]) / dxk if abs(dxk) > 1e-10 else (e[k] + eb[k]) / 2
        w.append(rho / log_mean)
    gr = []  # g_j times the multiplier of y_j w.r.t. z_j
    for j in range(n):
        y, yb = math.exp(float(x[j]) - lse), math.exp(float(xb[j]) - lse_b)
        dz = float(x[j] - xb[j]) - dlse
        gr.append(float(g[j]) * ((y - yb) / dz if abs(dz) > 1e-10 else (y + yb) / 2))
    return [gr[k] - sum(gr) * w[k] for k in range(n)]


def _captum_softmax(
    module: nn.Module, inputs: Tensor, outputs: Tensor, grad_input: Tensor,
    grad_output: Tensor, eps: float = 1e-10,
) -> Tensor:  # fmt: skip
    """Captum's hook signature around the literal rule (2-D inputs, softmax over dim 1)."""
    assert inputs.dim() == 2 and module.dim in (1, -1)  # type: ignore[operator]
    n = inputs.shape[0] // 2
    out = torch.empty_like(grad_input)
    for i in range(2 * n):
        x, xb = inputs[i % n], inputs[n + i % n]
        out[i] = torch.tensor(literal_softmax_multipliers(x, xb, grad_output[i]), dtype=F64)
    return out


@contextmanager
def captum_per_example_softmax() -> Iterator[None]:
    """Captum with its softmax rule swapped for the literal per-example one (parity suites)."""
    table = captum_deep_lift.SUPPORTED_NON_LINEAR
    saved = table[nn.Softmax]
    table[nn.Softmax] = _captum_softmax
    try:
        yield
    finally:
        table[nn.Softmax] = saved


def _init(model: nn.Module, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return model.to(F64).eval()


MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {
    "softmax": (lambda: nn.Sequential(nn.Linear(4, 5), nn.Softmax(1), nn.Linear(5, 2)), (4,)),
    "softmax_mid": (lambda: nn.Sequential(
        nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 5), nn.Softmax(dim=-1), nn.Linear(5, 3),
        nn.Tanh(), nn.Linear(3, 2),
    ), (4,)),
    "softmax_channels": (lambda: nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.Softmax(dim=1), nn.Flatten(), nn.Linear(3 * 4 * 4, 2),
    ), (1, 6, 6)),
    "pool1d_3_1": (lambda: nn.Sequential(
        nn.Conv1d(1, 2, 3), nn.ReLU(), nn.MaxPool1d(3, 1), nn.Flatten(), nn.Linear(2 * 6, 2),
    ), (1, 10)),
    "pool2d_3_1": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(3, stride=1), nn.Flatten(),
        nn.Linear(2 * 4 * 4, 2),
    ), (1, 8, 8)),
    "pool2d_resnet_stem": (lambda: nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1), nn.Flatten(),
        nn.Linear(2 * 4 * 4, 2),
    ), (1, 9, 9)),
    "pool3d_3_1": (lambda: nn.Sequential(
        nn.Conv3d(1, 2, 2), nn.MaxPool3d(3, stride=1), nn.Flatten(), nn.Linear(2 * 2 * 2 * 2, 2),
    ), (1, 5, 5, 5)),
}  # fmt: skip


def _data(name: str, seed: int, n: int = 4) -> tuple[nn.Module, Tensor, Tensor]:
    make, shape = MODELS[name]
    model = _init(make(), seed)
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn((n, *shape), generator=g, dtype=F64)
    b = torch.randn((n, *shape), generator=g, dtype=F64)
    return model, x, b


def _change(model: nn.Module, x: Tensor, b: Tensor, target: int) -> Tensor:
    with torch.no_grad():
        return (model(x) - model(b))[:, target]


def _row_sums(a: Tensor) -> Tensor:
    return a.reshape(a.shape[0], -1).sum(1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_deeplift_is_complete(name: str, seed: int) -> None:
    model, x, b = _data(name, seed)
    res = methods.attribute(
        model, x, "deeplift", baselines=b, target=1, return_convergence_delta=True
    )
    change = _change(model, x, b, 1)
    torch.testing.assert_close(_row_sums(res.attributions), change, rtol=0, atol=1e-10)
    assert res.convergence_delta.abs().max() < 1e-10


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_deeplift_shap_is_complete(name: str, seed: int) -> None:
    model, x, dist = _data(name, seed, n=3)
    res = methods.attribute(
        model, x, "deeplift_shap", baselines=dist, target=0, return_convergence_delta=True
    )
    assert res.convergence_delta.abs().max() < 1e-10
    with torch.no_grad():
        mean_change = model(x)[:, 0] - model(dist)[:, 0].mean()
    torch.testing.assert_close(_row_sums(res.attributions), mean_change, rtol=0, atol=1e-10)


LAYERS = {
    "softmax": "0",
    "softmax_mid": "2",
    "softmax_channels": "0",
    "pool1d_3_1": "1",
    "pool2d_3_1": "1",
    "pool2d_resnet_stem": "0",
    "pool3d_3_1": "0",
}


@pytest.mark.parametrize("name", list(MODELS))
def test_layer_deeplift_is_complete(name: str) -> None:
    model, x, b = _data(name, 0)
    for method, base in (("layer_deeplift", b), ("layer_deeplift_shap", b[:3])):
        res = methods.attribute(
            model, x, method, baselines=base, target=1, layer=LAYERS[name],
            return_convergence_delta=True,
        )  # fmt: skip
        assert res.convergence_delta.abs().max() < 1e-10, method


@pytest.mark.parametrize("ibs", [1, 2, 3, None])
@pytest.mark.parametrize("method", ["deeplift", "deeplift_shap"])
@pytest.mark.parametrize("name", list(MODELS))
def test_each_example_is_independent_of_the_others(name: str, method: str, ibs: Any) -> None:
    model, x, b = _data(name, 1, n=5)
    base = b if method == "deeplift" else b[:2]
    # distinct targets per row, so mixing rows would show
    target = [0, 1, 1, 0, 1]
    whole = methods.attribute(
        model, x, method, baselines=base, target=target, internal_batch_size=ibs
    ).attributions
    for i in range(5):
        alone = methods.attribute(
            model, x[i : i + 1], method, baselines=base[i : i + 1] if method == "deeplift"
            else base, target=target[i],
        ).attributions  # fmt: skip
        torch.testing.assert_close(whole[i : i + 1], alone, rtol=1e-12, atol=1e-14)


def test_softmax_rule_equals_the_literal_reference() -> None:
    model, x, b = _data("softmax_mid", 2)
    ours = methods.attribute(model, x, "deeplift", baselines=b, target=1).attributions
    with captum_per_example_softmax():
        ref = DeepLift(model).attribute(x, baselines=b, target=1)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-13)


def test_softmax_rule_is_the_gradient_for_a_shift_and_in_the_limit() -> None:
    model = _init(nn.Sequential(nn.Softmax(dim=1), nn.Linear(5, 2)), 0)
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(3), dtype=F64)
    grad = methods.attribute(model, x, "saliency", target=0, abs=False).attributions
    shift = torch.tensor([[0.7], [-1.3], [2.0], [0.1]], dtype=F64)
    for baseline, tol in ((x + shift, 1e-12), (x + 1e-7, 1e-6)):
        mult = methods.attribute(
            model, x, "deeplift", baselines=baseline, target=0, multiply_by_inputs=False
        ).attributions
        torch.testing.assert_close(mult, grad, rtol=tol, atol=tol)


def test_softmax_with_masked_logits() -> None:
    """-inf logits on both sides (attention masks) give finite, complete attributions."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.out = nn.Linear(4, 5), nn.Linear(5, 2)

        def forward(self, x: Tensor) -> Tensor:
            logits = self.lin(x).masked_fill(
                torch.tensor([0, 0, 1, 0, 1], dtype=torch.bool), float("-inf")
            )
            return self.out(torch.softmax(logits, dim=1))

    _, x, b = _data("softmax", 0)
    masked = _init(Masked(), 0)
    res = methods.attribute(masked, x, "deeplift", baselines=b, target=0,
                            return_convergence_delta=True)  # fmt: skip
    assert torch.isfinite(res.attributions).all()
    assert res.convergence_delta.abs().max() < 1e-10


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    ("pool", "flat"),
    [(nn.MaxPool2d(2), 2 * 3 * 3), (nn.MaxPool2d(2, stride=3), 2 * 2 * 2),
     (nn.MaxPool2d((2, 3), stride=(2, 3)), 2 * 3 * 2)],
    ids=["2", "2_stride3", "2x3"],
)  # fmt: skip
def test_non_overlapping_pools_equal_captum(pool: nn.Module, flat: int, seed: int) -> None:
    model = _init(nn.Sequential(
        nn.Conv2d(1, 2, 3), pool, nn.Flatten(), nn.Linear(flat, 4), nn.Tanh(), nn.Linear(4, 2),
    ), seed)  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 1, 9, 9, generator=g, dtype=F64)
    b = torch.randn(3, 1, 9, 9, generator=g, dtype=F64)
    ref = DeepLift(model).attribute(x, baselines=b, target=1)
    ours = methods.attribute(model, x, "deeplift", baselines=b, target=1).attributions
    torch.testing.assert_close(ours, ref, rtol=0, atol=0)


def test_overlapping_pool_differs_from_captum_where_captum_is_incomplete() -> None:
    model, x, b = _data("pool2d_3_1", 0)
    _, ref_delta = DeepLift(model).attribute(
        x, baselines=b, target=0, return_convergence_delta=True
    )
    assert ref_delta.abs().max() > 1e-3  # Captum's max_unpool drops shared argmaxes
    res = methods.attribute(model, x, "deeplift", baselines=b, target=0,
                            return_convergence_delta=True)  # fmt: skip
    assert res.convergence_delta.abs().max() < 1e-10


def _identity_softmax(n: int, dtype: torch.dtype) -> nn.Module:
    lin = nn.Linear(n, n, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(n))
    return nn.Sequential(lin, nn.Softmax(dim=1)).to(dtype)


@pytest.mark.parametrize(
    ("dtype", "gap", "tol"),
    [(torch.float32, 120.0, 1e-5), (torch.float32, 800.0, 1e-4),
     (torch.float64, 120.0, 1e-12), (torch.float64, 800.0, 1e-12),
     (torch.float64, 5000.0, 1e-12)],
)  # fmt: skip
def test_softmax_rule_is_complete_for_large_logit_gaps(
    dtype: torch.dtype, gap: float, tol: float
) -> None:
    """Issue 22 defect 1: at x = [gap, 0], baseline 0, the target's change 1 - 1/2 goes to the
    gapped logit (was [[88.5, 0]], delta 88, at a gap of 120: the baseline's exp underflowed)."""
    x = torch.tensor([[gap, 0.0]], dtype=dtype)
    res = methods.attribute(
        _identity_softmax(2, dtype), x, "deeplift", baselines=torch.zeros_like(x), target=0,
        return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(
        res.attributions, torch.tensor([[0.5, 0.0]], dtype=dtype), rtol=0, atol=tol
    )
    assert res.convergence_delta.abs().max() < tol


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-4), (torch.float64, 1e-11)])
@pytest.mark.parametrize("shift", [10.0, 1000.0, 1e5])
def test_softmax_rule_stays_the_gradient_for_large_shifts(
    dtype: torch.dtype, tol: float, shift: float
) -> None:
    """Logits that are an exact shift of the baseline's: the multipliers are the gradient and
    the attributions sum to the (zero) change, in float32 as well (delta was 180 at 1000)."""
    model = _identity_softmax(3, dtype)
    b = torch.tensor([[0.3, 1.7, -0.4]], dtype=dtype)
    x = b + shift
    res = methods.attribute(
        model, x, "deeplift", baselines=b, target=0, return_convergence_delta=True
    )
    ref = DeepLift(model).attribute(x, baselines=b, target=0, return_convergence_delta=True)
    assert res.convergence_delta.abs().max() <= max(tol * shift / 1000, 2 * ref[1].abs().max())
    mult = methods.attribute(
        model, x, "deeplift", baselines=b, target=0, multiply_by_inputs=False
    ).attributions
    grad = methods.attribute(model, x, "saliency", target=0, abs=False).attributions
    # x = b + shift rounds b to the ulp of the shift: the logits are a shift to that only
    rounding = 4 * torch.finfo(dtype).eps * shift
    torch.testing.assert_close(mult, grad, rtol=0, atol=rounding + 1e-12)


def test_softmax_after_max_pooling_with_confident_logits() -> None:
    """A max-pool convnet whose logits are far apart (a confident classifier), float32:
    complete to float32 rounding (the logits' gap underflowed the baseline's exp before)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3),
        nn.Softmax(dim=1),
    )  # fmt: skip
    with torch.no_grad():
        model[4].weight.mul_(2000.0)
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model[:5](x)
    gaps = (logits.max(1).values - logits.min(1).values).min()
    assert gaps > 110, f"the logits must be far apart for this test ({float(gaps)})"
    for target in range(3):
        res = methods.attribute(model, x, "deeplift", target=target, return_convergence_delta=True)
        assert torch.isfinite(res.attributions).all()
        assert res.convergence_delta.abs().max() < 1e-4
