"""methods.verify: an attribution against its float64 CPU reference (issue 14, item 4)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import methods
from methods.verify import TOLERANCE, verify


def _mlp(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).to(dtype)


class _Drift(nn.Module):
    """Right in float64, slightly off in any other dtype: the kind of fault that shows only
    on the serving path (a kernel that differs on one device or dtype)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _mlp(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        if x.dtype != torch.float64:
            y = y + 0.05 * x[:, :1] * x[:, 1:2]  # a fault the reference path never runs
        return y


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "deeplift"])
def test_float64_model_matches_its_reference(method: str) -> None:
    model = _mlp(torch.float64)
    x = torch.randn(4, 6, dtype=torch.float64)
    result, v = verify(model, x, method, target=1)
    assert v.ok and v.max_abs_diff < 1e-12 and v.reference == "cpu-float64"
    assert v.tolerance == TOLERANCE[torch.float64]
    assert isinstance(result.attributions, torch.Tensor)


def test_bfloat16_model_reports_its_real_deviation() -> None:
    model = _mlp(torch.bfloat16)
    x = torch.randn(8, 6).to(torch.bfloat16)
    result, v = verify(model, x, "integrated_gradients", target=0, n_steps=16)
    reference = _mlp(torch.float64)
    reference.load_state_dict({k: t.double() for k, t in model.state_dict().items()})
    expected = methods.attribute(reference, x.double(), "integrated_gradients", target=0,
                                 n_steps=16).attributions  # fmt: skip
    diff = (result.attributions.double() - expected).abs().max().item()
    assert v.max_abs_diff == pytest.approx(diff, rel=1e-12)
    assert 0 < v.max_rel_diff < v.tolerance == TOLERANCE[torch.bfloat16]
    assert next(model.parameters()).dtype == torch.bfloat16  # the caller's model untouched


def test_a_fault_off_the_reference_path_is_caught() -> None:
    model = _Drift()
    x = torch.randn(8, 6)
    _, v = verify(model, x, "saliency", target=2, abs=False)
    assert not v.ok and v.max_rel_diff > v.tolerance
    _, clean = verify(model.body, x, "saliency", target=2, abs=False)
    assert clean.ok


def test_stochastic_methods_are_refused() -> None:
    model = _mlp(torch.float32)
    x = torch.randn(3, 6)
    with pytest.raises(methods.InvalidArgumentError, match="deterministic"):
        verify(model, x, "gradient_shap", target=1, baselines=torch.randn(5, 6), seed=3)
    with pytest.raises(methods.InvalidArgumentError, match="deterministic"):
        verify(model, x, "saliency", target=1, noise_tunnel={"nt_samples": 2}, seed=3)


def test_models_without_a_float64_copy_are_refused() -> None:
    model = _mlp(torch.float32)
    program = torch.export.export(model, (torch.randn(2, 6),))
    with pytest.raises(methods.UnsupportedModelError, match="float64"):
        verify(program, torch.randn(2, 6), "saliency", target=0)
