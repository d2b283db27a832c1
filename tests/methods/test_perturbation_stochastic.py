"""Stochastic perturbation methods: reproducible under seed, and right where axioms decide."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import methods
from tests import zoo

STOCHASTIC = ["shapley_value_sampling", "kernel_shap", "lime", "feature_permutation"]


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _run(case: zoo.Case, method: str, **kw: Any) -> tuple[torch.Tensor, ...]:
    res = methods.attribute(
        case.model, case.inputs, method, target=case.target,
        additional_forward_args=case.additional_forward_args, **kw,
    )  # fmt: skip
    return _tuple(res.attributions)


@pytest.mark.parametrize("method", STOCHASTIC)
def test_reproducible_under_seed(method: str) -> None:
    c = zoo.by_name("two_input")
    a = _run(c, method, seed=11)
    b = _run(c, method, seed=11, perturbations_per_eval=2)
    other = _run(c, method, seed=12)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)
    assert any(not torch.allclose(x, y) for x, y in zip(a, other, strict=True))


@pytest.mark.parametrize("case", ["mlp", "two_input", "module_twin", "cnn"])
def test_shapley_sampling_efficiency_is_exact(case: str) -> None:
    c = zoo.by_name(case)
    xs = _tuple(c.inputs)
    attrs = _run(c, "shapley_value_sampling", baselines=c.baselines, n_samples=3, seed=0)
    # default mask: every scalar is a feature, so the attributions sum over features
    total = sum(a.reshape(a.shape[0], -1).sum(1) for a in attrs)
    from methods.engine.baselines import format_baselines
    from methods.engine.targets import make_target

    bs = format_baselines(c.baselines, xs)
    args = c.additional_forward_args
    args = () if args is None else (args if isinstance(args, tuple) else (args,))
    tgt = make_target(c.target, xs[0].shape[0])
    with torch.no_grad():
        gap = tgt.select(c.model(*xs, *args)) - tgt.select(c.model(*bs, *args))
    torch.testing.assert_close(total, gap, rtol=1e-12, atol=1e-12)


def test_shapley_sampling_converges_to_exact() -> None:
    c = zoo.by_name("mlp")
    mask = torch.tensor([[0, 1, 2, 3, 4, 4]])
    exact = _run(c, "shapley_values", feature_mask=mask)[0]
    errors = []
    for n in (4, 64, 1024):
        est = _run(c, "shapley_value_sampling", feature_mask=mask, n_samples=n, seed=5)[0]
        errors.append(float((est - exact).abs().max()))
    assert errors[2] < errors[0] / 4
    assert errors[2] < 0.1 * float(exact.abs().max())


@pytest.mark.parametrize("case", ["mlp", "two_input", "module_twin"])
def test_kernel_shap_over_all_coalitions_is_exact_shapley(case: str) -> None:
    c = zoo.by_name(case)
    mask: Any = {"mlp": torch.tensor([[0, 0, 1, 2, 3, 3]]),
                 "two_input": (torch.tensor([[0, 1, 1, 2]]), torch.tensor([[2, 3, 4]])),
                 "module_twin": torch.tensor([[0, 1, 2, 3, 4]])}[case]  # fmt: skip
    exact = _run(c, "shapley_values", baselines=c.baselines, feature_mask=mask)
    ks = _run(c, "kernel_shap", baselines=c.baselines, feature_mask=mask, n_samples=1 << 5)
    for a, b in zip(ks, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_kernel_shap_sampled_satisfies_efficiency() -> None:
    c = zoo.by_name("module_twin")
    ks = _run(c, "kernel_shap", n_samples=40, seed=2, return_input_shape=False)[0]
    full = _run(c, "shapley_values", feature_mask=torch.tensor([[0, 0, 0, 0, 0]]))[0][:, 0]
    torch.testing.assert_close(ks.sum(1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("model", ["linear_regression", "ridge", "lasso"])
def test_lime_recovers_linear_weights(model: str) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, generator=g, dtype=torch.float64)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64)

    def f(t: torch.Tensor) -> torch.Tensor:
        return t @ w + 0.25

    alpha = {"linear_regression": 0.0, "ridge": 1e-6, "lasso": 1e-6}[model]
    coef = methods.attribute(f, x, "lime", n_samples=300, seed=4, interpretable_model=model,
                             alpha=alpha, return_input_shape=False).attributions  # fmt: skip
    # with zero baselines the coefficient of feature j is w_j * x_j, for every example
    torch.testing.assert_close(coef, w * x, rtol=1e-4, atol=1e-4)


def test_feature_permutation_ignores_unused_features_and_aggregates() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 0.0, -2.0, 0.0], dtype=torch.float64)
    attrs = methods.attribute(lambda t: t @ w, x, "feature_permutation", seed=0).attributions
    assert attrs.shape == (8, 4)
    assert bool((attrs[:, [1, 3]] == 0).all()) and bool((attrs[:, [0, 2]] != 0).any())
    loss = methods.attribute(lambda t: ((t @ w) ** 2).mean(), x, "feature_permutation", seed=0)
    assert loss.attributions.shape == (1, 4)
    assert loss.params["perturbations_per_eval"] == 1


def test_feature_permutation_two_examples_never_identity() -> None:
    x = torch.tensor([[1.0, 2.0], [3.0, 5.0]], dtype=torch.float64)
    attrs = methods.attribute(lambda t: t.sum(1), x, "feature_permutation", seed=3).attributions
    # with two examples the only non-identity permutation swaps them
    torch.testing.assert_close(attrs, torch.tensor([[-2.0, -3.0], [2.0, 3.0]], dtype=torch.float64))


def _softmax_classifier() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3), torch.nn.Softmax(1)
    ).double()
    return m, torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def test_kernel_shap_batched_equals_one_example_at_a_time() -> None:
    """KernelSHAP's coalitions are shared by the batch: per-example targets, same seed, the
    batch and each example alone agree exactly (issue 22, also look at)."""
    m, x = _softmax_classifier()
    batch = methods.attribute(m, x, "kernel_shap", target=[0, 1, 2], n_samples=64, seed=3)
    for i in range(3):
        alone = methods.attribute(m, x[i : i + 1], "kernel_shap", target=i, n_samples=64, seed=3)
        torch.testing.assert_close(batch.attributions[i : i + 1], alone.attributions)


def test_lime_batched_and_alone_differ_only_by_their_samples() -> None:
    """LIME draws each example's samples in turn from one generator, so a batch's example i and
    the same example alone see different samples; with enough samples both converge to the
    same surrogate, per-example targets paired right (a wrong pairing would not)."""
    m, x = _softmax_classifier()
    kw: dict[str, Any] = {"n_samples": 4000, "interpretable_model": "linear_regression"}
    batch = methods.attribute(m, x, "lime", target=[0, 1, 2], seed=0, **kw).attributions
    for i in range(3):
        alone = methods.attribute(m, x[i : i + 1], "lime", target=i, seed=0, **kw).attributions
        assert not torch.equal(batch[i : i + 1], alone)  # other samples
        torch.testing.assert_close(batch[i : i + 1], alone, rtol=0, atol=2e-3)
        other = methods.attribute(m, x[i : i + 1], "lime", target=(i + 1) % 3, seed=0, **kw)
        assert (other.attributions - batch[i : i + 1]).abs().max() > 1e-2
