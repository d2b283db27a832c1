"""Inputs that are not per example (Captum's "sparse features", CONTRACT §7.7): fed whole to
every evaluation, grouped by ``feature_mask``, with Captum's numbers; refused, naming the
argument, by the methods that cannot take them."""

from __future__ import annotations

from typing import Any

import captum.attr as ca
import pytest
import torch
from torch import nn

import methods

X = torch.tensor([[1.0, -2.0, 3.0], [2.0, -1.0, 3.0]])
IDS = torch.tensor([1, 7, 2, 4, 5, 3, 6])  # a list whose length is not the batch's
TABLE = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


class Summed(nn.Module):
    """Captum's BasicModelWithSparseInputs: one value for the whole batch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(3, 1)
        with torch.no_grad():
            self.lin1.weight.copy_(torch.tensor([[3.0, 1.0, 2.0]]))
            self.lin1.bias.zero_()

    def forward(self, inputs: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return (self.lin1(inputs) + (sparse[0] if sparse.numel() > 0 else 0)).sum()


class PerExample(Summed):
    """One value per example, every example reading the whole sparse input."""

    def forward(self, inputs: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.lin1(inputs) + (sparse.float().sum() if sparse.numel() > 0 else 0)


class Table(nn.Module):
    """A 2-d input that is not per example (a lookup table), its columns weighted apart."""

    def forward(self, a: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return a.sum(1, keepdim=True) * (table[:, 0].sum() + 2 * table[:, 1].sum())


DETERMINISTIC = {
    "feature_ablation": ca.FeatureAblation,
    "shapley_values": ca.ShapleyValues,
    "shapley_value_sampling": ca.ShapleyValueSampling,
}
MASKS: list[Any] = [
    None,
    (torch.tensor([[0, 1, 2]]), torch.tensor(3)),
    (torch.tensor([[0, 0, 1]]), torch.tensor([5])),
]


@pytest.mark.parametrize("model", [Summed, PerExample])
@pytest.mark.parametrize("method", sorted(DETERMINISTIC))
@pytest.mark.parametrize("mask", range(len(MASKS)))
def test_captums_sparse_features(model: type[nn.Module], method: str, mask: int) -> None:
    m = model()
    kw: dict[str, Any] = {"feature_mask": MASKS[mask]}
    if method == "shapley_value_sampling":
        kw["n_samples"] = 3  # exact here: the sparse feature adds the same wherever it enters
    ref = DETERMINISTIC[method](m).attribute((X, IDS), **kw)
    ours = methods.attribute(m, (X, IDS), method, seed=0, **kw).attributions
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b.to(a.dtype), rtol=1e-5, atol=1e-5)


def test_captums_empty_sparse_features() -> None:
    ours = methods.attribute(Summed(), (X, torch.tensor([])), "feature_ablation").attributions
    torch.testing.assert_close(ours[0], torch.tensor([[9.0, -3.0, 12.0]]))
    torch.testing.assert_close(ours[1], torch.tensor([0.0]))


@pytest.mark.parametrize(
    "mask", [None, (torch.tensor([[0, 1, 2]]), torch.tensor([[3, 4]])),
             (torch.tensor([[0, 1, 2]]), torch.tensor([[3, 3]]))],
)  # fmt: skip
@pytest.mark.parametrize("ppe", [1, 3])
def test_a_two_dim_sparse_input_grouped_by_columns(mask: Any, ppe: int) -> None:
    """Whole into every forward, one perturbation each: Captum's numbers at
    perturbations_per_eval=1 whatever is asked (Captum stacks the table ppe times, which
    changes what the model computes)."""
    ref = ca.FeatureAblation(Table()).attribute((X, TABLE), feature_mask=mask, target=0,
                                                baselines=(0.0, 5.0))  # fmt: skip
    res = methods.attribute(Table(), (X, TABLE), "feature_ablation", feature_mask=mask,
                            target=0, baselines=(0.0, 5.0), perturbations_per_eval=ppe)  # fmt: skip
    for a, b in zip(res.attributions, ref, strict=True):
        torch.testing.assert_close(a, b)
    assert res.params["perturbations_per_eval"] == 1


def test_feature_permutation_shuffles_the_sparse_rows() -> None:
    """Captum permutes an input that is not per example along its own rows."""
    moved = []
    for seed in range(6):
        res = methods.attribute(Summed(), (X, IDS), "feature_permutation", seed=seed)
        assert torch.equal(res.attributions[0], torch.zeros(1, 3))  # a summed output
        # 2 examples x (ids[0] - the id that took its place)
        moved.append(float(res.attributions[1]))
        assert 1 - moved[-1] / 2 in IDS.tolist()
    assert any(moved)


@pytest.mark.parametrize("method", ["lime", "kernel_shap", "occlusion", "integrated_gradients"])
def test_methods_that_cannot_take_them_refuse(method: str) -> None:
    with pytest.raises(methods.InvalidArgumentError) as e:
        kw = {"sliding_window_shapes": (1,)} if method == "occlusion" else {}
        methods.attribute(Summed(), (X, IDS.float()), method, **kw)
    assert e.value.argument == "inputs" and "sparse" in str(e.value)


def test_a_mask_must_group_the_sparse_input_as_a_whole() -> None:
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(
            Summed(), (X, IDS), "feature_ablation",
            feature_mask=(torch.tensor([[0, 1, 2]]), torch.tensor([3, 3, 4, 4, 4, 5, 5])),
        )  # fmt: skip
    assert e.value.argument == "feature_mask" and "not per example" in str(e.value)
    with pytest.raises(methods.InvalidArgumentError) as e:
        methods.attribute(Summed(), (X, IDS), "feature_ablation",
                          noise_tunnel={"nt_type": "smoothgrad"})  # fmt: skip
    assert e.value.argument == "noise_tunnel"


def test_perturbations_per_eval_is_still_checked() -> None:
    with pytest.raises(methods.AttributionError) as e:
        methods.attribute(Summed(), (X, IDS), "feature_ablation", perturbations_per_eval=0)
    assert e.value.argument == "perturbations_per_eval"
