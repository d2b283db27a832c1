"""methods.min_perturbation: per example, equal to Captum's MinParamPerturbation run on that
example alone (linear and binary search) for every perturbation; None where nothing in range
flips; typed errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from captum.attr import Saliency
from captum.robust import FGSM, PGD, MinParamPerturbation
from torch import nn

import methods
from methods.errors import InvalidArgumentError, UnknownParameterError

F64 = torch.float64
torch.manual_seed(0)
MODEL = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double().eval()
X = torch.randn(6, 6, generator=torch.Generator().manual_seed(2), dtype=F64)
with torch.no_grad():
    Y = MODEL(X).argmax(1)
NOISE = torch.randn(X.shape, generator=torch.Generator().manual_seed(7), dtype=F64)
RANGES = {
    "fgsm": (0.0, 1.5, 0.05),
    "pgd": (0.0, 1.5, 0.05),
    "gaussian_noise": (0.0, 3.0, 0.1),
    "feature_ablation": (0, 7, 1),
}


def _ablate(inp: torch.Tensor, k: int, target: int) -> torch.Tensor:
    """The k elements of highest saliency (Captum's) set to 0, by hand."""
    attr = Saliency(MODEL).attribute(inp, target=target)
    order = torch.argsort(attr.reshape(-1), descending=True, stable=True)
    out = inp.clone().reshape(-1)
    out[order[:k]] = 0.0
    return out.reshape(inp.shape)


def captum_attack(name: str, i: int) -> Any:
    y: Any = Y[i : i + 1]
    if name == "fgsm":
        return lambda inp, epsilon: FGSM(MODEL, nn.CrossEntropyLoss(reduction="none")).perturb(
            inp, epsilon, y
        )
    if name == "pgd":
        return lambda inp, radius: PGD(MODEL, nn.CrossEntropyLoss(reduction="none")).perturb(
            inp, radius=radius, step_size=2.5 * radius / 10, step_num=10, target=y
        )
    if name == "gaussian_noise":
        return lambda inp, std: inp + std * NOISE[i : i + 1]
    return lambda inp, k: _ablate(inp, int(k), int(Y[i]))


ARG = {"fgsm": "epsilon", "pgd": "radius", "gaussian_noise": "std", "feature_ablation": "k"}
PARAMS: dict[str, dict[str, Any]] = {
    "fgsm": {"loss": "cross_entropy"},
    "pgd": {"loss": "cross_entropy"},
    "gaussian_noise": {"seed": 7},
    "feature_ablation": {},
}


@pytest.mark.parametrize("mode", ["linear", "binary"])
@pytest.mark.parametrize("name", list(RANGES))
def test_each_example_equals_captum_on_it_alone(name: str, mode: str) -> None:
    lo, hi, step = RANGES[name]
    ours = methods.min_perturbation(
        MODEL, X, name, target=Y, arg_min=lo, arg_max=hi, arg_step=step, mode=mode, **PARAMS[name]
    )
    assert any(v is not None for v in ours.min_param)
    for i in range(len(X)):
        search = MinParamPerturbation(
            MODEL, captum_attack(name, i), ARG[name], lo, hi, step, mode=mode
        )
        perturbed, param = search.evaluate(X[i : i + 1], target=Y[i : i + 1])
        if param is None:
            assert ours.min_param[i] is None
            torch.testing.assert_close(ours.perturbed[i], X[i], rtol=0, atol=0)
        else:
            assert ours.min_param[i] == pytest.approx(param, abs=1e-12)
            torch.testing.assert_close(ours.perturbed[i], perturbed[0], rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(ours.predictions, MODEL(ours.perturbed))


def test_nothing_in_range_flips_gives_none() -> None:
    res = methods.min_perturbation(
        MODEL, X, "fgsm", target=Y, arg_min=0.0, arg_max=0.002, arg_step=0.001, loss="cross_entropy"
    )
    assert res.min_param == [None] * len(X)
    torch.testing.assert_close(res.perturbed, X, rtol=0, atol=0)


def test_feature_groups_are_removed_together() -> None:
    mask = torch.tensor([0, 0, 1, 1, 2, 2])
    res = methods.min_perturbation(
        MODEL, X, "feature_ablation", target=Y, arg_min=0, arg_max=4, arg_step=1, feature_mask=mask
    )
    for i, k in enumerate(res.min_param):
        if k is not None:
            zeroed = (res.perturbed[i] == 0).reshape(3, 2)
            assert int(zeroed.all(1).sum()) == k and torch.equal(zeroed.all(1), zeroed.any(1))


def test_typed_errors() -> None:
    kw = dict(target=Y, arg_min=0.0, arg_max=1.0, arg_step=0.1)
    with pytest.raises(InvalidArgumentError, match="perturbation must be one of"):
        methods.min_perturbation(MODEL, X, "rotation", **kw)
    with pytest.raises(UnknownParameterError):
        methods.min_perturbation(MODEL, X, "fgsm", epsilon=0.1, **kw)
    with pytest.raises(InvalidArgumentError, match="mode"):
        methods.min_perturbation(MODEL, X, "fgsm", mode="ternary", **kw)
    with pytest.raises(InvalidArgumentError, match="arg_max"):
        methods.min_perturbation(MODEL, X, "fgsm", target=Y, arg_min=0, arg_max=0.1, arg_step=0.1)
    with pytest.raises(InvalidArgumentError, match="arg_step"):
        methods.min_perturbation(MODEL, X, "fgsm", target=Y, arg_min=0, arg_max=1, arg_step=0)


def test_a_mask_per_example_is_refused() -> None:
    per_example = torch.arange(6).repeat(len(X), 1)
    with pytest.raises(InvalidArgumentError, match="one mask for all examples"):
        methods.min_perturbation(
            MODEL,
            X,
            "feature_ablation",
            target=Y,
            arg_min=0,
            arg_max=4,
            arg_step=1,
            feature_mask=per_example,
        )


def test_feature_ablation_ranks_with_the_additional_forward_args() -> None:
    """The attribution that ranks the features runs the model as the search does: with its
    additional forward arguments (it raised the model's TypeError before)."""

    class Gated(nn.Module):
        def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
            return MODEL(x * gate)

    gate = torch.linspace(0.2, 1.8, 6, dtype=F64)[None]  # one row: not an argument per example
    kw: dict[str, Any] = {"target": Y, "arg_min": 0, "arg_max": 7, "arg_step": 1}
    got = methods.min_perturbation(
        Gated().eval(), X, "feature_ablation", additional_forward_args=(gate,), **kw
    )
    baked = nn.Sequential()
    baked.forward = lambda x: MODEL(x * gate)  # type: ignore[method-assign]
    want = methods.min_perturbation(baked, X, "feature_ablation", **kw)
    assert got.min_param == want.min_param
    torch.testing.assert_close(got.perturbed, want.perturbed)
