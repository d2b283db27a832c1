"""infidelity and sensitivity_max: Captum parity (same perturbations) and known answers."""

from __future__ import annotations

import torch
from captum.attr import Saliency
from captum.metrics import infidelity as captum_infidelity
from captum.metrics import sensitivity_max as captum_sensitivity_max

import methods
from methods.metrics import infidelity_perturb_func_decorator
from tests import zoo


def _noise(inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    noise = torch.randn(inputs.shape, dtype=inputs.dtype) * 0.1
    return noise, inputs - noise


def test_infidelity_matches_captum() -> None:
    c = zoo.by_name("mlp")
    attr = methods.attribute(
        c.model, c.inputs, "integrated_gradients", target=c.target
    ).attributions
    for normalize in (False, True):
        for max_rows in (None, 8):
            kw = dict(
                target=c.target,
                n_perturb_samples=5,
                max_examples_per_batch=max_rows,
                normalize=normalize,
            )
            torch.manual_seed(3)
            ours = methods.infidelity(c.model, _noise, c.inputs, attr, **kw)
            torch.manual_seed(3)
            ref = captum_infidelity(c.model, _noise, c.inputs, attr, **kw)
            torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_infidelity_of_a_perfect_explanation_of_a_linear_model_is_zero() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    grad = methods.attribute(lin, x, "saliency", target=1, abs=False).attributions
    assert float(methods.infidelity(lin, _noise, x, grad, target=1).abs().max()) < 1e-20

    @infidelity_perturb_func_decorator(multiply_by_inputs=True)
    def shrink(inputs: torch.Tensor) -> torch.Tensor:
        return inputs * torch.rand(inputs.shape, dtype=inputs.dtype)

    ixg = methods.attribute(lin, x, "input_x_gradient", target=1).attributions
    assert float(methods.infidelity(lin, shrink, x, ixg, target=1).abs().max()) < 1e-20
    bad = methods.infidelity(lin, _noise, x, -grad, target=1)
    assert float(bad.min()) > 1e-4


def test_sensitivity_max_matches_captum() -> None:
    c = zoo.by_name("mlp")

    def perturb(inputs: torch.Tensor, radius: float) -> torch.Tensor:
        return inputs + (torch.rand(inputs.shape, dtype=inputs.dtype) * 2 - 1) * radius

    def explain(inputs: torch.Tensor, target: object) -> torch.Tensor:
        return methods.attribute(c.model, inputs, "saliency", target=target).attributions

    sal = Saliency(c.model)

    def captum_explain(inputs: object, target: object) -> object:
        # Captum passes the unperturbed inputs as a tuple and needs a tuple back for them
        if isinstance(inputs, tuple):
            return (sal.attribute(inputs[0].detach().requires_grad_(), target=target),)
        return sal.attribute(inputs.detach().requires_grad_(), target=target)  # type: ignore[attr-defined]

    for max_rows in (None, 8):
        torch.manual_seed(4)
        ours = methods.sensitivity_max(
            explain,
            c.inputs,
            perturb,
            perturb_radius=0.5,
            n_perturb_samples=6,
            target=c.target,
            max_examples_per_batch=max_rows,
        )
        torch.manual_seed(4)
        ref = captum_sensitivity_max(
            captum_explain,
            c.inputs,
            perturb,
            perturb_radius=0.5,
            n_perturb_samples=6,
            target=c.target,
            max_examples_per_batch=max_rows,
        )
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
        assert ours.shape == (4,)


def test_sensitivity_of_a_constant_explanation_is_zero() -> None:
    x = torch.randn(3, 5, dtype=torch.float64)
    s = methods.sensitivity_max(lambda inp: torch.ones_like(inp), x)
    torch.testing.assert_close(s, torch.zeros(3, dtype=torch.float64))
