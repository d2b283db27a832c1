"""Where a pass costs its launches (a GPU), f(inputs) and f(baselines) ride in the path's first
pass instead of a forward of their own (``path.ENDS_IN_PATH``). Forced on here, on the CPU:
the same attributions and convergence deltas as the separate forward (Captum's), in fewer
model calls, for integrated gradients and layer integrated gradients, fixed and "auto"."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.engine import path

captum_attr = pytest.importorskip("captum.attr")


class Skip(nn.Module):
    """The input bypasses layer ``a``: f(b) needs b itself, not just a's value at b."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)) + x)


def counted(model: nn.Module) -> list[int]:
    calls: list[int] = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def run(riding: bool, method: str, monkeypatch: pytest.MonkeyPatch, **kw: Any) -> Any:
    model = Skip().double().eval()
    x = torch.rand(3, 6, dtype=torch.float64)
    calls = counted(model)
    with monkeypatch.context() as m:
        if riding:
            m.setattr(path, "ENDS_IN_PATH", {"cpu"})
        res = methods.attribute(model, x, method, target=1, baselines=0.3,
                                return_convergence_delta=True, **kw)  # fmt: skip
    return res, len(calls), model, x


@pytest.mark.parametrize(
    ("method", "kw"),
    [
        ("integrated_gradients", {"n_steps": 20}),
        ("integrated_gradients", {"n_steps": 7, "approximation_method": "riemann_trapezoid"}),
        ("integrated_gradients", {"n_steps": "auto", "delta_tolerance": 1e-4}),
        ("integrated_gradients", {"n_steps": "auto", "approximation_method": "gausslegendre"}),
        ("layer_integrated_gradients", {"layer": "a", "n_steps": 20}),
        ("layer_integrated_gradients", {"layer": "a", "n_steps": "auto"}),
        ("layer_integrated_gradients", {"layer": "a", "n_steps": 12, "internal_batch_size": 6}),
    ],
)
def test_the_endpoints_in_the_path_pass_give_the_same_answer(
    monkeypatch: pytest.MonkeyPatch, method: str, kw: dict[str, Any]
) -> None:
    apart, apart_calls, _, _ = run(False, method, monkeypatch, **kw)
    along, along_calls, _, _ = run(True, method, monkeypatch, **kw)
    torch.testing.assert_close(along.attributions, apart.attributions, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(along.convergence_delta, apart.convergence_delta,
                               rtol=1e-8, atol=1e-12)  # fmt: skip
    assert along.params.get("n_steps") == apart.params.get("n_steps")
    # the endpoints' forward is gone (a layer's stops at the layer: the model is not called)
    assert along_calls == apart_calls - 1


def test_the_delta_is_captum_s_where_the_input_bypasses_the_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The baselines' end runs on the baselines themselves: Captum's f(b), not the model on
    the inputs with the layer's value at the baselines swapped in."""
    ours, _, model, x = run(True, "layer_integrated_gradients", monkeypatch, layer="a",
                            n_steps=20)  # fmt: skip
    lig = captum_attr.LayerIntegratedGradients(model, model.a)
    attrs, delta = lig.attribute(x, baselines=0.3, target=1, n_steps=20,
                                 return_convergence_delta=True)  # fmt: skip
    torch.testing.assert_close(ours.attributions, attrs, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(ours.convergence_delta, delta, rtol=1e-8, atol=1e-12)
    assert delta.abs().max() > 1e-3  # the bypass makes completeness fail: a real check
