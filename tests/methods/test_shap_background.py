"""Shapley values as shap 0.51.0 computes them: background sets (interventional values, shap's
``Independent`` masker and ``KernelExplainer`` over a weighted summary), ``base_values``, the
scale attributed (``output``), ``target={"top_k": K}`` and ``methods.kmeans`` against
``shap.kmeans``. Captum has no background sets: its single-baseline answers are what each
background row gives, which the per-row check below compares with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import shap
import torch
from captum.attr import ShapleyValues
from shap.utils._legacy import DenseData

import methods
from methods.errors import BaselineError, InvalidArgumentError, TargetError

F = 5  # features: 2**5 coalitions, exact in every method below


def mlp(seed: int = 0, classes: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    return (
        torch.nn.Sequential(torch.nn.Linear(F, 8), torch.nn.Tanh(), torch.nn.Linear(8, classes))
        .double()
        .eval()
    )


def data(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, F, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def column(model: torch.nn.Module, k: int, scale: str = "raw") -> Any:
    """The model's class ``k`` on numpy rows, on a scale, as shap calls a model."""

    def f(a: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            out = model(torch.as_tensor(a, dtype=torch.float64))
        if scale == "probability":
            out = torch.softmax(out, 1)
        return out[:, k].numpy()

    return f


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_shapley_values_over_a_background_equal_shaps_exact_explainer(seed: int) -> None:
    model, x, bg = mlp(seed), data(4, seed + 10), data(12, seed + 20)
    ours = methods.attribute(model, x, "shapley_values", target=2, baselines=methods.Background(bg))
    explainer = shap.ExactExplainer(column(model, 2), shap.maskers.Independent(bg.numpy(), 100))
    theirs = explainer(x.numpy())
    np.testing.assert_allclose(ours.attributions.numpy(), theirs.values, atol=1e-12)
    np.testing.assert_allclose(ours.base_values.numpy(), theirs.base_values, atol=1e-12)
    # efficiency: the attributions complete the base value to the output
    torch.testing.assert_close(
        ours.attributions.sum(1) + ours.base_values, model(x)[:, 2].detach(), atol=1e-12, rtol=0
    )


def test_a_weighted_summary_equals_shaps_kernel_explainer_on_it() -> None:
    """kernel_shap with every coalition over a weighted background (a K-means summary) is
    KernelExplainer's answer on the same DenseData."""
    model, x = mlp(2), data(3, 3)
    summary = methods.kmeans(data(40, 4), 6)
    ours = methods.attribute(model, x, "kernel_shap", target=0, baselines=summary, n_samples=2**F)
    rows = summary.rows.numpy()
    weights = summary.weights.numpy()
    dense = DenseData(rows, [str(i) for i in range(F)], None, weights)
    explainer = shap.KernelExplainer(column(model, 0), dense)
    theirs = explainer.shap_values(x.numpy(), nsamples=2**F, silent=True)
    np.testing.assert_allclose(ours.attributions.numpy(), theirs, atol=1e-10)
    np.testing.assert_allclose(ours.base_values.numpy(), explainer.expected_value, atol=1e-12)


def test_a_background_is_the_mean_of_captums_answers_per_row() -> None:
    model, x, bg = mlp(3), data(2, 5), data(3, 6)
    ours = methods.attribute(model, x, "shapley_values", target=1, baselines={"background": bg})
    per_row = [ShapleyValues(model).attribute(x, b.unsqueeze(0), target=1) for b in bg]
    want = torch.stack(per_row).mean(0).double()
    torch.testing.assert_close(ours.attributions, want, atol=1e-6, rtol=0)


def test_sampled_methods_share_their_draws_across_the_background_and_stay_efficient() -> None:
    """shapley_value_sampling credits every row with the same permutations: its answer over a
    background is exactly efficient, and close to the exact values."""
    model, x, bg = mlp(4), data(3, 7), data(8, 8)
    exact = methods.attribute(model, x, "shapley_values", target=0, baselines={"background": bg})
    sampled = methods.attribute(
        model, x, "shapley_value_sampling", target=0, baselines={"background": bg},
        n_samples=300, seed=0,
    )  # fmt: skip
    torch.testing.assert_close(sampled.base_values, exact.base_values, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        sampled.attributions.sum(1) + sampled.base_values, model(x)[:, 0].detach(), atol=1e-12,
        rtol=0,
    )  # fmt: skip
    assert float((sampled.attributions - exact.attributions).abs().max()) < 0.05
    assert sampled.params["background_rows"] == 8


def test_gradient_methods_average_over_the_background_and_distributions_take_the_rows() -> None:
    model, x, bg = mlp(5), data(2, 9), data(4, 10)
    ig = methods.attribute(model, x, "integrated_gradients", target=1, baselines={"background": bg})
    each = [methods.attribute(model, x, "integrated_gradients", target=1, baselines=b) for b in bg]
    torch.testing.assert_close(
        ig.attributions, torch.stack([r.attributions for r in each]).mean(0), atol=1e-12, rtol=0
    )
    assert ig.base_values is None  # not a Shapley-family method
    shap_rows = methods.attribute(
        model, x, "gradient_shap", target=1, baselines={"background": bg}, seed=3
    )
    plain = methods.attribute(model, x, "gradient_shap", target=1, baselines=bg, seed=3)
    torch.testing.assert_close(shap_rows.attributions, plain.attributions)


@pytest.mark.parametrize("scale", ["probability", "log_probability", "log_odds"])
def test_the_output_scale_is_what_is_attributed(scale: str) -> None:
    model, x, b = mlp(6), data(3, 11), data(1, 12)
    ours = methods.attribute(
        model, x, "shapley_values", target=2, baselines={"background": b}, output=scale
    )
    p = torch.softmax(model(x).detach(), 1)[:, 2]
    want = {"probability": p, "log_probability": p.log(), "log_odds": (p / (1 - p)).log()}
    torch.testing.assert_close(ours.attributions.sum(1) + ours.base_values, want[scale])
    # with one background row shap's link over the probability is the same value function
    if scale == "log_odds":
        explainer = shap.ExactExplainer(
            column(model, 2, "probability"),
            shap.maskers.Independent(b.numpy()),
            link=shap.links.logit,
            linearize_link=False,
        )
        theirs = explainer(x.numpy())
        np.testing.assert_allclose(ours.attributions.numpy(), theirs.values, atol=1e-10)
    single = torch.nn.Linear(F, 1).double()
    one = methods.attribute(
        single, x, "shapley_values", target=0, baselines=b, output="probability"
    )
    sig = torch.sigmoid(single(x).detach())[:, 0]
    torch.testing.assert_close(one.attributions.sum(1) + one.base_values, sig)


def test_top_k_explains_each_examples_best_classes_in_one_request() -> None:
    model, x, bg = mlp(7, classes=4), data(3, 13), data(5, 14)
    ours = methods.attribute(
        model, x, "shapley_values", target={"top_k": 2}, baselines={"background": bg}
    )
    best = model(x).detach().argsort(1, descending=True)[:, :2]
    assert torch.equal(ours.target, best)
    assert tuple(ours.attributions.shape) == (3, 2, F)
    for k in range(2):
        one = methods.attribute(
            model, x, "shapley_values", target=best[:, k], baselines={"background": bg}
        )
        torch.testing.assert_close(ours.attributions[:, k], one.attributions)
        torch.testing.assert_close(ours.base_values[:, k], one.base_values)
    # per-example baselines follow their examples into every class's copy
    base = data(3, 15)
    tk = methods.attribute(model, x, "integrated_gradients", target={"top_k": 2}, baselines=base)
    ig = methods.attribute(model, x, "integrated_gradients", target=best[:, 1], baselines=base)
    torch.testing.assert_close(tk.attributions[:, 1], ig.attributions)


@pytest.mark.processes  # scikit-learn's KMeans (in shap.kmeans) asks lscpu for the cores
def test_kmeans_finds_the_clusters_shap_kmeans_finds() -> None:
    """On well-separated clusters both find the same centres (snapped to data values) and
    sizes; shap normalises the weights, which ours leave as counts (a background's weights
    are shares either way)."""
    gen = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0] * F, [10.0] * F, [-10.0, 10.0, -10.0, 10.0, -10.0]])
    sizes = [7, 12, 5]
    rows = torch.cat(
        [c + 0.1 * torch.randn(s, F, generator=gen) for c, s in zip(centres, sizes, strict=True)]
    ).double()
    ours = methods.kmeans(rows, 3)
    theirs = shap.kmeans(rows.numpy(), 3)
    order = np.lexsort(theirs.data.T)
    mine = np.lexsort(ours.rows.numpy().T)
    np.testing.assert_allclose(ours.rows.numpy()[mine], theirs.data[order])
    np.testing.assert_allclose(
        ours.weights.numpy()[mine] / ours.weights.sum().item(), theirs.weights[order]
    )


def test_bad_backgrounds_and_targets_are_refused_naming_them() -> None:
    model, x = mlp(8), data(2, 16)
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"baselines": {"background": torch.zeros(3, 4)}}, BaselineError, "shape"),
        ({"baselines": {"background": data(3, 1), "weights": [1, 2]}}, BaselineError, "weights"),
        ({"baselines": {"background": data(3, 1), "weights": [1, -1, 0]}}, BaselineError, "neg"),
        ({"baselines": {"background": data(3, 1), "extra": 1}}, BaselineError, "unknown"),
        ({"target": {"top_k": 0}}, TargetError, "top_k"),
        ({"target": {"top_k": 9}}, TargetError, "3 classes"),
        ({"output": "logit"}, InvalidArgumentError, "output"),
    ]
    for kwargs, error, words in cases:
        kwargs.setdefault("target", 0)
        with pytest.raises(error, match=words):
            methods.attribute(model, x, "shapley_values", **kwargs)
    with pytest.raises(BaselineError, match="uniformly"):
        methods.attribute(
            model, x, "gradient_shap", target=0, baselines=methods.kmeans(data(9, 2), 2)
        )


def test_the_standard_error_covers_the_exact_values_as_often_as_it_says() -> None:
    """shapley_value_sampling's standard_error (the permutations' spread over their count):
    +-1.96 SE covers the exact Shapley value about 95% of the time; over a background it is
    an upper bound (the rows share their permutations), so it covers more often."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
    ).double()
    x = torch.randn(8, 6, dtype=torch.float64)
    background = {"background": torch.randn(5, 6, dtype=torch.float64)}
    for base, low, high in [(None, 0.92, 0.97), (background, 0.95, 1.0)]:
        exact = methods.attribute(model, x, "shapley_values", target=0, baselines=base)
        hits = total = 0
        for seed in range(40):
            r = methods.attribute(
                model, x, "shapley_value_sampling", target=0, n_samples=30, seed=seed,
                baselines=base,
            )  # fmt: skip
            assert r.standard_error.shape == r.attributions.shape
            inside = (r.attributions - exact.attributions).abs() <= 1.96 * r.standard_error
            hits, total = hits + int(inside.sum()), total + inside.numel()
        assert low <= hits / total <= high, (base is None, hits / total)


@pytest.mark.parametrize("n_samples", [20, 45])
def test_kernel_shaps_standard_error_covers_the_exact_values_as_often_as_it_says(
    n_samples: int,
) -> None:
    """kernel_shap's standard_error (the fit's spread over bootstrap resamples of its
    coalitions): +-1.96 SE covers the exact Shapley value about 95% of the time; 0 where every
    coalition is enumerated."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
    ).double()
    x = torch.randn(6, 6, dtype=torch.float64)
    exact = methods.attribute(model, x, "shapley_values", target=0)
    hits = total = 0
    for seed in range(30):
        r = methods.attribute(model, x, "kernel_shap", target=0, n_samples=n_samples, seed=seed)
        assert r.standard_error.shape == r.attributions.shape
        inside = (r.attributions - exact.attributions).abs() <= 1.96 * r.standard_error
        hits, total = hits + int(inside.sum()), total + inside.numel()
    assert 0.88 <= hits / total <= 0.99, hits / total
    enumerated = methods.attribute(model, x, "kernel_shap", target=0, n_samples=64)
    assert torch.all(enumerated.standard_error == 0)


@pytest.mark.parametrize("method", ["shapley_value_sampling", "kernel_shap"])
@pytest.mark.parametrize("tolerance", [0.2, 0.02])
def test_auto_samples_until_each_examples_error_is_within_tolerance(
    method: str, tolerance: float
) -> None:
    """n_samples="auto": each example's largest standard error ends at most tolerance x its
    largest |attribution| (or every coalition is enumerated: exact, error 0), the answer
    says how many samples and evaluations it took, and a tighter tolerance takes more."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)
    ).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    exact = methods.attribute(model, x, "shapley_values", target=1).attributions
    r = methods.attribute(model, x, method, target=1, n_samples="auto", tolerance=tolerance, seed=0)
    worst = r.standard_error.abs().amax(1) / r.attributions.abs().amax(1)
    assert bool((worst <= tolerance).all()), worst
    samples = r.params["samples"]
    assert samples["n_samples"] >= 16 and samples["evaluations"] >= samples["n_samples"]
    # the answer is as close to the exact values as its error says
    assert bool(((r.attributions - exact).abs() <= 4 * r.standard_error + 1e-12).all())
    loose = methods.attribute(model, x, method, target=1, n_samples="auto", tolerance=0.5, seed=0)
    assert loose.params["samples"]["evaluations"] <= samples["evaluations"]


@pytest.mark.parametrize("bad", [{"tolerance": 0}, {"tolerance": 1.5}, {"n_samples": "most"}])
def test_bad_auto_sampling_params_are_refused(bad: dict[str, Any]) -> None:
    model = mlp()
    with pytest.raises((InvalidArgumentError, methods.errors.InvalidTypeError)) as info:
        methods.attribute(model, data(2, 0), "kernel_shap", target=0, **bad)
    assert info.value.argument in bad
