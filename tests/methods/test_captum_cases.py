"""Cases from Captum 0.9.0's own unit tests that ours once failed (issue 36): a loss that closes
over its batch under feature permutation, a sparse input's mask as long as the input, a list of
layers with a layer the target does not reach, and DeepLift through softmax at logits near
1e6 in float32 (a deliberate difference: docs/methods.md)."""

from __future__ import annotations

import warnings

import pytest
import torch
from captum.attr import FeaturePermutation, LayerGradientXActivation, LayerIntegratedGradients
from captum.testing.helpers.basic_models import BasicEmbeddingModel, BasicModel_MultiLayer
from captum.testing.helpers.classification_models import SoftmaxDeepLiftModel

import methods
from methods.errors import InvalidArgumentError


def test_a_forward_that_takes_only_its_own_batch_is_permuted_one_perturbation_per_forward() -> None:
    """A loss closing over the batch's 20 labels cannot take 40 rows: one perturbation per
    forward, whatever the batching asked (docs/methods.md)."""
    torch.manual_seed(0)
    labels = torch.randint(0, 3, (20,))
    lin = torch.nn.Linear(25, 3).double()

    def loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(lin(torch.cat([a.flatten(1), b.flatten(1)], 1)),
                                                 labels)  # fmt: skip

    a, b = torch.randn(20, 5, 2, dtype=torch.float64), torch.randn(20, 5, 3, dtype=torch.float64)
    masks = (torch.zeros(1, 5, 2, dtype=torch.long), torch.zeros(1, 5, 3, dtype=torch.long))
    runs = [
        methods.attribute(
            loss, (a, b), "feature_permutation", feature_mask=masks, target=None, seed=3, **kw
        ).attributions
        for kw in ({}, {"perturbations_per_eval": 4}, {"perturbations_per_eval": 1})
    ]
    for got in runs[:2]:
        for x, y in zip(got, runs[2], strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    # one feature over both inputs: its score is the loss's change under one permutation of
    # the batch, the same in every element
    first = runs[2][0]
    assert torch.all(first == first.flatten()[0]) and first.flatten()[0] != 0
    # Captum with its own permutation: the same kind of number (a change of the loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = FeaturePermutation(loss).attribute((a, b), feature_mask=masks,
                                                 perturbations_per_eval=1)  # fmt: skip
    assert ref[0].shape == first.shape and torch.all(ref[0] == ref[0].flatten()[0])


def test_a_sparse_input_s_mask_may_be_as_long_as_the_input() -> None:
    """Captum's case: the second input is not per example (2 rows for 1 example) and its mask
    has its shape; Captum broadcasts it, and so do we."""
    a = torch.tensor([[1.0, 2.0]])
    b = torch.tensor([[3.0, 4.0], [5.0, 6.0]])
    mask = (torch.tensor([0, 0]), torch.tensor([[0, 0], [0, 0]]))

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x.sum(1) + y.sum()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Captum skips a batch of one
        ref = FeaturePermutation(forward).attribute((a, b), feature_mask=mask)
    got = methods.attribute(forward, (a, b), "feature_permutation", feature_mask=mask,
                            target=None, seed=0).attributions  # fmt: skip
    for x, y in zip(got, ref, strict=True):
        torch.testing.assert_close(x, y)
    # with several examples: the same as the one-row mask it repeats
    a4 = torch.randn(4, 2, dtype=torch.float64)
    b3 = torch.randn(3, 2, dtype=torch.float64)
    long_mask = (torch.tensor([0, 1]), torch.tensor([[2, 3]] * 3))
    row_mask = (torch.tensor([0, 1]), torch.tensor([[2, 3]]))
    both = [
        methods.attribute(
            forward, (a4, b3), "feature_permutation", feature_mask=m, target=None, seed=1
        ).attributions
        for m in (long_mask, row_mask)
    ]
    for x, y in zip(*both, strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    rows_differ = (torch.tensor([0, 1]), torch.tensor([[2, 3], [3, 2], [2, 2]]))
    with pytest.raises(InvalidArgumentError, match="same ids") as e:
        methods.attribute(
            forward, (a4, b3), "feature_permutation", target=None, feature_mask=rows_differ
        )
    assert e.value.argument == "feature_mask"


def test_a_list_of_layers_gives_what_each_layer_alone_gives() -> None:
    """Captum's model: with ``multi_input_module`` its ``relu`` runs but its output is thrown
    away. Alone it gets zeros (inputs that require grad, as in Captum's tests: the target is
    reached, not through it) or the error naming it (nothing reached); in a list, the same."""
    model = BasicModel_MultiLayer(multi_input_module=True).double()
    x = torch.tensor([[3.0, 4.0, 0.0]], dtype=torch.float64, requires_grad=True)
    listed = methods.attribute(
        model, x, "layer_gradient_x_activation", layer=["linear1", "relu"], target=0
    ).attributions
    for path, got in zip(["linear1", "relu"], listed, strict=True):
        alone = methods.attribute(
            model, x, "layer_gradient_x_activation", layer=path, target=0
        ).attributions
        torch.testing.assert_close(got, alone, rtol=0, atol=0)
    ref = LayerGradientXActivation(model, model.linear1).attribute(x, target=0)
    torch.testing.assert_close(listed[0], ref)
    assert torch.count_nonzero(listed[1]) == 0 and torch.count_nonzero(listed[0]) > 0
    plain = x.detach()
    for layer in ("relu", ["linear1", "relu"]):
        with pytest.raises(InvalidArgumentError, match="does not depend on layer 'relu'"):
            methods.attribute(model, plain, "layer_gradient_x_activation", layer=layer, target=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_deeplift_through_softmax_at_logits_near_a_million(dtype: torch.dtype) -> None:
    """Captum's ``SoftmaxDeepLiftModel(40, 20, 10)`` (all-ones weights) on arange(120): the
    logits (3e5 to 1.6e6) are nearly a shift of the baseline's. Complete in float64; in
    float32 the logits themselves are resolved to 0.125 and the multipliers are the softmax's
    gradient (rows summing to zero), so the delta is at float32's resolution of the logits,
    not Captum's smaller one (its softmax rule is not complete: docs/methods.md)."""
    torch.manual_seed(0)
    model = SoftmaxDeepLiftModel(40, 20, 10).to(dtype).eval()
    x = torch.arange(120.0, dtype=dtype).reshape(3, 40)
    res = methods.attribute(model, x, "deeplift", baselines=0.0, target=1,
                            return_convergence_delta=True)  # fmt: skip
    with torch.no_grad():
        logits = model.lin3(model.relu2(model.lin2(model.relu1(model.lin1(x)))))
    resolution = torch.finfo(dtype).eps * float(logits.abs().max())
    assert float(res.convergence_delta.abs().max()) <= (
        1e-9 if dtype == torch.float64 else resolution
    )


def test_joint_and_per_layer_ig_agree_only_for_additive_layers() -> None:
    """docs/python-api.md: Captum's joint layer IG over a list equals ours (each layer's own
    path) where the layers add up with nothing non-linear after the join, not where a ReLU
    follows it (Captum's BasicEmbeddingModel)."""
    torch.manual_seed(0)
    model = BasicEmbeddingModel().double()
    ids = (torch.tensor([[3, 2, 0, 1], [1, 4, 2, 2]]), torch.tensor([[1, 0, 3, 2], [0, 2, 4, 1]]))
    paths = ["embedding1", "embedding2"]

    def gap() -> float:
        layers = [model.get_submodule(p) for p in paths]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Captum warns about lists of layers
            joint = LayerIntegratedGradients(model, layers).attribute(ids, target=0, n_steps=50)
        ours = methods.attribute(
            model, ids, "layer_integrated_gradients", layer=paths, target=0, n_steps=50
        ).attributions
        return max(
            float((j - o).abs().max() / j.abs().max()) for j, o in zip(joint, ours, strict=True)
        )

    assert gap() > 0.1  # the ReLU after the join: the joint path shares the interaction
    model.relu = torch.nn.Identity()
    assert gap() < 1e-6  # additive: the same (Captum's float32 alphas)
