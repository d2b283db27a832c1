"""Regressions found in review: Captum 0.9.0 parity on cases outside the model matrix."""

from __future__ import annotations

import torch
from captum.attr import DeepLiftShap, GradientShap, IntegratedGradients, NoiseTunnel
from torch import nn

import methods


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double().eval()


def test_noise_tunnel_deltas_are_concatenated_per_partition_like_captum() -> None:
    model = _mlp()
    x = torch.randn(3, 4, dtype=torch.float64)
    b = torch.randn(3, 4, dtype=torch.float64)
    _, ref = NoiseTunnel(IntegratedGradients(model)).attribute(
        x, baselines=b, target=1, nt_samples=5, stdevs=0.0, nt_samples_batch_size=2,
        n_steps=5, return_convergence_delta=True,
    )  # fmt: skip
    ours = methods.attribute(
        model, x, "integrated_gradients", target=1, baselines=b, n_steps=5,
        noise_tunnel={"nt_samples": 5, "stdevs": 0.0, "nt_samples_batch_size": 2},
        return_convergence_delta=True,
    ).convergence_delta  # fmt: skip
    assert ours is not None
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-9)


def test_noise_tunnel_over_shap_methods_returns_every_delta() -> None:
    model = _mlp()
    x = torch.randn(3, 4, dtype=torch.float64)
    dist = torch.randn(3, 4, dtype=torch.float64)
    _, ref = NoiseTunnel(DeepLiftShap(model)).attribute(
        x, baselines=dist, target=1, nt_samples=4, stdevs=0.0, return_convergence_delta=True
    )
    ours = methods.attribute(
        model, x, "deeplift_shap", target=1, baselines=dist,
        noise_tunnel={"nt_samples": 4, "stdevs": 0.0}, return_convergence_delta=True,
    ).convergence_delta  # fmt: skip
    assert ours is not None
    torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-12)
    gs = methods.attribute(
        model, x, "gradient_shap", target=1, baselines=dist, n_samples=5,
        noise_tunnel={"nt_samples": 4, "stdevs": 0.0}, return_convergence_delta=True,
    ).convergence_delta  # fmt: skip
    assert gs is not None and gs.shape == (3 * 4 * 5,)


class _TwoInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.a(x) + self.b(z))


def test_noise_tunnel_accepts_per_example_baselines_given_as_a_list() -> None:
    torch.manual_seed(0)
    model = _TwoInput().double()
    xs = (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64))
    bs = (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64))
    for method in ("integrated_gradients", "deeplift"):
        nt = {"nt_samples": 3, "stdevs": 0.0}
        as_list = methods.attribute(
            model, xs, method, baselines=list(bs), target=0, noise_tunnel=nt
        ).attributions
        as_tuple = methods.attribute(model, xs, method, baselines=bs, target=0, noise_tunnel=nt)
        torch.testing.assert_close(as_list, as_tuple.attributions, rtol=0, atol=0)


class _Pooled(nn.Module):
    """conv -> tanh -> conv -> max pool over length 14; ``dilated`` pools every other position."""

    def __init__(self, dilated: bool) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.conv1 = nn.Conv1d(2, 3, 3, padding=1)
        self.act = nn.Tanh()
        self.conv2 = nn.Conv1d(3, 3, 1)
        self.dilated = dilated
        self.pool = nn.MaxPool1d(2, stride=4, dilation=2) if dilated else nn.MaxPool1d(2)
        self.out = nn.Linear(9, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(self.act(self.conv1(x)))
        if not self.dilated:
            h = h[..., ::2].contiguous()
        return self.out(self.pool(h).flatten(1))


def test_deeplift_through_a_dilated_max_pool() -> None:
    # max_unpool cannot size a dilated pool's input (Captum 0.9.0 raises ValueError); the max
    # rule must still hold: the dilated pool is the plain pool of every other position.
    dilated, plain = _Pooled(True).double(), _Pooled(False).double()
    x = torch.randn(2, 2, 14, dtype=torch.float64)
    b = 0.3 * torch.randn(2, 2, 14, dtype=torch.float64)
    ours = methods.attribute(
        dilated, x, "deeplift", baselines=b, target=1, return_convergence_delta=True
    )
    ref = methods.attribute(plain, x, "deeplift", baselines=b, target=1)
    torch.testing.assert_close(ours.attributions, ref.attributions, rtol=1e-10, atol=1e-12)
    assert ours.convergence_delta is not None
    assert float(ours.convergence_delta.abs().max()) < 1e-10


GRADIENT_METHODS = (
    "saliency", "input_x_gradient", "integrated_gradients", "gradient_shap", "deeplift",
    "deeplift_shap", "guided_backprop", "deconvolution",
)  # fmt: skip
WITH_DELTA = {"integrated_gradients", "gradient_shap", "deeplift", "deeplift_shap"}


def test_outputs_constant_in_the_inputs_have_zero_gradient_not_a_raw_autograd_error() -> None:
    # A detached, integer or boolean output does not depend differentiably on the inputs:
    # zero attributions (as for an input the model does not use), and the delta is the change.
    torch.manual_seed(0)
    lin = nn.Linear(4, 3).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    models = {
        "detached": lambda t: lin(t).detach(),
        "integer": lambda t: (lin(t) > 0).long(),
        "boolean": lambda t: lin(t) > 0,
    }
    for kind, model in models.items():
        for method in GRADIENT_METHODS:
            shap = method in ("gradient_shap", "deeplift_shap")
            res = methods.attribute(
                model, x, method, target=1,
                baselines=torch.zeros(2, 4, dtype=torch.float64) if shap else None,
                return_convergence_delta=method in WITH_DELTA,
            )  # fmt: skip
            assert isinstance(res.attributions, torch.Tensor), (kind, method)
            assert not bool(res.attributions.any()), (kind, method)
            if method in WITH_DELTA:
                assert res.convergence_delta is not None
                assert torch.isfinite(res.convergence_delta).all(), (kind, method)


def test_draw_baseline_from_distrib_without_baselines_keeps_the_default() -> None:
    # Captum only draws when baselines were given; without, the method's default (zeros) holds.
    model = _mlp()
    x = torch.randn(3, 4, dtype=torch.float64)
    nt = {"nt_samples": 3, "stdevs": 0.0, "draw_baseline_from_distrib": True}
    ref = NoiseTunnel(IntegratedGradients(model)).attribute(
        x, target=0, nt_samples=3, stdevs=0.0, draw_baseline_from_distrib=True
    )
    ours = methods.attribute(model, x, "integrated_gradients", target=0, noise_tunnel=nt)
    torch.testing.assert_close(ours.attributions, ref, rtol=1e-6, atol=1e-9)
    for method in ("saliency", "deeplift", "guided_backprop"):
        plain = methods.attribute(model, x, method, target=0, noise_tunnel=nt | {"nt_samples": 1})
        expected = methods.attribute(model, x, method, target=0).attributions
        torch.testing.assert_close(plain.attributions, expected, rtol=1e-12, atol=1e-12)


def test_baseline_distributions_mix_numbers_and_reference_rows() -> None:
    # (rows tensor, number): the number is one reference row whatever is drawn. Captum accepts
    # this for GradientShap and NoiseTunnel(draw_baseline_from_distrib); rows are identical here
    # so the draw does not matter and the numbers must agree exactly.
    torch.manual_seed(0)
    model = _TwoInput().double()
    xs = (torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64))
    rows = torch.randn(1, 4, dtype=torch.float64).expand(2, 4).clone()
    linear = nn.Linear(4, 3).double()

    def lin2(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return linear(x) + z.sum(1, keepdim=True)

    ref_gs, ref_delta = GradientShap(lin2).attribute(
        xs, baselines=(rows, 0.5), target=0, n_samples=3, return_convergence_delta=True
    )
    gs = methods.attribute(
        lin2, xs, "gradient_shap", baselines=(rows, 0.5), target=0, n_samples=3,
        return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(gs.attributions, ref_gs, rtol=1e-9, atol=1e-12)
    assert gs.convergence_delta is not None and gs.convergence_delta.shape == ref_delta.shape
    nt = {"nt_samples": 2, "stdevs": 0.0, "draw_baseline_from_distrib": True}
    ref = NoiseTunnel(IntegratedGradients(model)).attribute(
        xs, baselines=(rows, 0.5), target=0, nt_samples=2, stdevs=0.0,
        draw_baseline_from_distrib=True,
    )  # fmt: skip
    ours = methods.attribute(
        model, xs, "integrated_gradients", baselines=(rows, 0.5), target=0, noise_tunnel=nt
    )
    torch.testing.assert_close(ours.attributions, ref, rtol=1e-6, atol=1e-9)
