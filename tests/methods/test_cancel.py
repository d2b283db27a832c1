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
