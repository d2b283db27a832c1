"""Cancellation: a cancelled attribution stops within about one chunk and leaves the model as
it was found."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.cancel import checkpoint
from methods.metrics import infidelity
from tests import zoo

K = 3  # forwards before the flag goes up


class Counting(nn.Module):
    """A 3-class MLP whose forward counts its calls and raises a flag after ``K`` of them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = zoo.MLP((6, 16, 16, 3)).double()
        self.calls = 0
        self.flag = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls >= K:
            self.flag = True
        return self.net(x)


CASES: list[tuple[str, dict[str, Any]]] = [
    ("integrated_gradients", {"n_steps": 40, "internal_batch_size": 8}),
    ("integrated_gradients", {"n_steps": "auto", "internal_batch_size": 8,
                              "approximation_method": "riemann_left"}),
    ("feature_ablation", {"perturbations_per_eval": 1}),
    ("shapley_value_sampling", {"n_samples": 4, "perturbations_per_eval": 1}),
    ("occlusion", {"sliding_window_shapes": (1,), "perturbations_per_eval": 1}),
    ("kernel_shap", {"n_samples": 30, "perturbations_per_eval": 1}),
    ("lime", {"n_samples": 30, "perturbations_per_eval": 1}),
    ("feature_permutation", {"perturbations_per_eval": 1}),
    ("gradient_shap", {"n_samples": 20, "internal_batch_size": 8,
                       "baselines": torch.zeros(3, 6, dtype=torch.float64)}),
    ("deeplift", {"internal_batch_size": 2}),
    ("layer_conductance", {"layer": "net.net.0", "n_steps": 40, "internal_batch_size": 8}),
    ("saliency", {"noise_tunnel": {"nt_samples": 20, "nt_samples_batch_size": 1}}),
]  # fmt: skip


def _hooks(model: nn.Module) -> list[tuple[int, int, int]]:
    return [
        (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
        for m in model.modules()
    ]


@pytest.mark.parametrize(("name", "kw"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_cancelled_attribution_stops_within_a_chunk(name: str, kw: dict[str, Any]) -> None:
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    free = Counting()
    methods.attribute(free, x, name, target=1, seed=0, **kw)
    assert free.calls > K + 2, "the case is too small to show an early stop"

    model = Counting()
    before = _hooks(model)
    with methods.cancel_scope(lambda: model.flag), pytest.raises(methods.AttributionCancelled):
        methods.attribute(model, x, name, target=1, seed=0, **kw)
    assert model.calls <= K + 1
    assert _hooks(model) == before
    assert all(p.requires_grad for p in model.parameters())


class Last(Counting):
    """Raises its flag at its ``last``-th forward: the work left is the method's own."""

    def __init__(self, last: int) -> None:
        super().__init__()
        self.last = last

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        self.flag = self.calls >= self.last
        return out


@pytest.mark.parametrize(
    ("name", "kw"),
    [
        ("kernel_shap", {"n_samples": 30}),
        ("lime", {"n_samples": 30}),
        ("lime", {"n_samples": 30, "interpretable_model": "lasso", "alpha": 0.01}),
    ],
    ids=["kernel_shap", "lime", "lime-lasso"],
)
def test_surrogate_fits_check_between_examples(name: str, kw: dict[str, Any]) -> None:
    """After the last model evaluation a surrogate still fits one model per example (seconds
    each on thousands of features): a request cancelled then stops before the next fit."""
    x = torch.randn(8, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    free = Counting()
    methods.attribute(free, x, name, target=1, seed=0, **kw)
    model = Last(free.calls)
    with methods.cancel_scope(lambda: model.flag), pytest.raises(methods.AttributionCancelled):
        methods.attribute(model, x, name, target=1, seed=0, **kw)
    assert model.calls == free.calls  # every evaluation ran: the fit was what stopped


def test_wide_coalitions_are_ranked_and_sorted_between_checkpoints() -> None:
    """Kernel SHAP's sampling and the coalitions' de-duplication over thousands of features
    (seconds of work before the model sees a coalition) look at the scope as they go: many
    times between the first evaluation (the empty coalition) and the second."""
    model = nn.Linear(4096, 2).double()
    x = torch.randn(2, 4096, dtype=torch.float64)
    seen = {"calls": 0, "polls": 0, "between": 0}

    def stop() -> bool:
        seen["polls"] += 1
        if seen["calls"] == 1:
            seen["between"] += 1
        return False

    model.register_forward_pre_hook(lambda *_: seen.__setitem__("calls", seen["calls"] + 1))
    with methods.cancel_scope(stop):
        methods.attribute(model, x, "kernel_shap", target=0, n_samples=600, seed=0)
    assert seen["calls"] >= 2 and seen["between"] >= 4096 // 62  # one per word packed, at least


def test_incremental_occlusion_checks_between_chunks() -> None:
    c = zoo.by_name("cnn")
    polls = {"n": 0}

    def stop() -> bool:
        polls["n"] += 1
        return polls["n"] > 2

    with methods.cancel_scope(stop), pytest.raises(methods.AttributionCancelled):
        methods.attribute(
            c.model, c.inputs, "occlusion", target=c.target,
            sliding_window_shapes=(3, 2, 2), perturbations_per_eval=1,
        )  # fmt: skip
    assert polls["n"] == 3


def test_metrics_check_between_sample_chunks() -> None:
    c = zoo.by_name("mlp")
    x = c.inputs
    assert isinstance(x, torch.Tensor)

    def perturb(inp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noise = torch.full_like(inp, 0.01)
        return noise, inp - noise

    with methods.cancel_scope(lambda: True), pytest.raises(methods.AttributionCancelled):
        infidelity(c.model, perturb, x, torch.ones_like(x), target=c.target)


def test_scopes_nest_and_end() -> None:
    checkpoint()  # no scope: nothing happens
    with methods.cancel_scope(lambda: False):
        checkpoint()
        with methods.cancel_scope(lambda: True), pytest.raises(methods.AttributionCancelled):
            checkpoint()
        checkpoint()  # the inner scope is gone
    outer, inner = methods.cancel_scope(lambda: True), methods.cancel_scope(lambda: False)
    with outer, inner, pytest.raises(methods.AttributionCancelled) as info:
        checkpoint()
    assert isinstance(info.value, methods.AttributionError)
    assert str(info.value) == "the attribution was cancelled"
    checkpoint()


def test_scopes_are_per_thread() -> None:
    seen: list[BaseException | None] = []

    def other() -> None:
        try:
            checkpoint()
            seen.append(None)
        except methods.AttributionCancelled as exc:
            seen.append(exc)

    with methods.cancel_scope(lambda: True):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == [None]
