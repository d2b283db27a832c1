"""Perturbation methods refuse bad arguments with typed errors that name the argument."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import methods
from methods.errors import InvalidArgumentError, InvalidTypeError

X = torch.randn(3, 4, dtype=torch.float64)
W = torch.randn(4, 2, dtype=torch.float64)


def model(t: torch.Tensor) -> torch.Tensor:
    return t @ W


MASKED = ["feature_ablation", "feature_permutation", "shapley_values", "shapley_value_sampling",
          "kernel_shap", "lime"]  # fmt: skip


def _raises(kind: type[Exception], argument: str, method: str, **kw: Any) -> str:
    kw.setdefault("target", 0)
    with pytest.raises(kind) as info:
        methods.attribute(model, X, method, **kw)
    assert getattr(info.value, "argument", None) == argument
    assert argument in str(info.value) or argument.replace("_", " ") in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("method", MASKED)
@pytest.mark.parametrize(
    "mask",
    [torch.zeros(2, 4, dtype=torch.long), torch.zeros(1, 5, dtype=torch.long),
     torch.zeros(1, 1, 4, dtype=torch.long), (torch.zeros(1, 4, dtype=torch.long),) * 2],
)  # fmt: skip
def test_feature_mask_of_the_wrong_shape(method: str, mask: Any) -> None:
    _raises(InvalidArgumentError, "feature_mask", method, feature_mask=mask)


@pytest.mark.parametrize("method", MASKED)
@pytest.mark.parametrize(
    "mask",
    [torch.full((1, 4), 0.5), torch.tensor([[0.0, 1.0, float("nan"), 1.0]]),
     torch.zeros(1, 4, dtype=torch.bool), [0, 1]],
)  # fmt: skip
def test_feature_mask_of_the_wrong_type(method: str, mask: Any) -> None:
    _raises(InvalidTypeError, "feature_mask", method, feature_mask=mask)


@pytest.mark.parametrize(
    ("windows", "strides", "argument"),
    [((5,), None, "sliding_window_shapes"), ((2, 2), None, "sliding_window_shapes"),
     ((0,), None, "sliding_window_shapes"), (((2,), (2,)), None, "sliding_window_shapes"),
     ((2,), 3, "strides"), ((2,), 0, "strides"), ((2,), (1, 1), "strides")],
)  # fmt: skip
def test_occlusion_windows_and_strides(windows: Any, strides: Any, argument: str) -> None:
    _raises(InvalidArgumentError, argument, "occlusion", sliding_window_shapes=windows,
            strides=strides)  # fmt: skip


def test_occlusion_needs_windows() -> None:
    _raises(InvalidArgumentError, "sliding_window_shapes", "occlusion")


@pytest.mark.parametrize("method", ["shapley_value_sampling", "kernel_shap", "lime"])
@pytest.mark.parametrize("n", [0, -3])
def test_non_positive_n_samples(method: str, n: int) -> None:
    _raises(InvalidArgumentError, "n_samples", method, n_samples=n)


def test_too_many_features_for_exact_shapley() -> None:
    x = torch.randn(2, 17, dtype=torch.float64)
    with pytest.raises(InvalidArgumentError) as info:
        methods.attribute(lambda t: t.sum(1), x, "shapley_values")
    assert info.value.argument == "feature_mask"
    assert "17 features" in str(info.value) and "16" in str(info.value)


@pytest.mark.parametrize("method", [*MASKED, "occlusion"])
@pytest.mark.parametrize("ppe", [0, -1, 1.5, "all"])
def test_bad_perturbations_per_eval(method: str, ppe: Any) -> None:
    kw = {"sliding_window_shapes": (1,)} if method == "occlusion" else {}
    _raises(InvalidArgumentError, "perturbations_per_eval", method, perturbations_per_eval=ppe,
            **kw)  # fmt: skip


def test_feature_permutation_of_one_example_is_zero_as_in_captum() -> None:
    from captum.attr import FeaturePermutation

    got = methods.attribute(model, X[:1], "feature_permutation", target=0).attributions
    want = FeaturePermutation(model).attribute(X[:1], target=0)
    assert got.shape == want.shape == (1, 4)
    torch.testing.assert_close(got, want)
    assert not bool(got.any())


@pytest.mark.parametrize("method", MASKED)
def test_integral_float_feature_masks_are_taken(method: str) -> None:
    """Captum takes a float feature_mask whose values are whole numbers: so do we, with the
    answer of the same integer mask."""
    mask = torch.tensor([[0, 0, 1, 1]])
    a = methods.attribute(model, X, method, target=0, feature_mask=mask.double(), seed=3)
    b = methods.attribute(model, X, method, target=0, feature_mask=mask, seed=3)
    torch.testing.assert_close(a.attributions, b.attributions)


@pytest.mark.parametrize("method", ["lime", "kernel_shap"])
def test_surrogates_need_one_value_per_example(method: str) -> None:
    _raises(InvalidArgumentError, "target", method, target=None)


@pytest.mark.parametrize("method", ["feature_ablation", "shapley_values", "lime"])
def test_per_example_mask_with_a_per_batch_output(method: str) -> None:
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0], [0, 1, 0, 1]])
    with pytest.raises(InvalidArgumentError) as info:
        methods.attribute(lambda t: (t @ W).sum(), X, method, feature_mask=mask)
    assert info.value.argument == "feature_mask"


def test_baselines_that_do_not_broadcast() -> None:
    _raises(InvalidArgumentError, "baselines", "feature_ablation", baselines=torch.zeros(3, 5))
