"""``partition``: Owen values equal to shap 0.51.0's ``PartitionExplainer`` on the same model,
hierarchy and masking: tabular (a given linkage; ``"correlation"`` over a background set),
images (shap's ``Image`` masker: blur, a value, inpainting) and texts (shap's ``Text``
masker's token tree from the tokenizer). Both the fully expanded tree (exact Owen values) and
a ``max_evals`` cut (the same nodes expanded in the same order) are compared. On a linear
model Owen values are Shapley values (checked against the exact ``shapley_values``, itself
checked against Captum)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shap
import torch
from scipy.cluster.hierarchy import average

import methods
from methods.engine.hierarchy import axis_splits, correlation_tree, single_linkage
from methods.errors import InvalidArgumentError, InvalidTypeError

F = 7


def mlp(seed: int, inputs: int = F, classes: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers = [torch.nn.Linear(inputs, 6), torch.nn.Tanh(), torch.nn.Linear(6, classes)]
    return torch.nn.Sequential(*layers).double().eval()


def rows(n: int, seed: int, f: int = F) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, dtype=torch.float64, generator=g)
    x[:, 3] = x[:, 1] * 2 + 0.3 * torch.randn(n, dtype=torch.float64, generator=g)  # correlated
    return x


def numpy_model(model: torch.nn.Module, shape: tuple[int, ...] | None = None) -> Any:
    def f(a: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.asarray(a), dtype=torch.float64)
        if shape is not None:  # shap's images are channels last
            t = t.reshape(-1, *shape).permute(0, 3, 1, 2)
        with torch.no_grad():
            return model(t).numpy()

    return f


@pytest.mark.parametrize("max_evals", [500, 40, 9])
@pytest.mark.parametrize("seed", [0, 1])
def test_correlation_over_a_background_equals_shaps_partition_masker(
    seed: int, max_evals: int
) -> None:
    model, x, bg = mlp(seed), rows(5, seed + 10), rows(30, seed + 20)
    masker = shap.maskers.Partition(bg.numpy(), clustering="correlation")
    theirs = shap.PartitionExplainer(numpy_model(model), masker)(
        x.numpy(), max_evals=max_evals, outputs=[2], silent=True
    )
    ours = methods.attribute(
        model, x, "partition", target=2, baselines=methods.Background(bg), max_evals=max_evals
    )
    np.testing.assert_allclose(ours.attributions.numpy(), theirs.values[..., 0], atol=1e-12)
    np.testing.assert_allclose(ours.base_values.numpy(), theirs.base_values[:, 0], atol=1e-12)
    # efficiency, whatever max_evals: the credit left on unexpanded nodes is shared down
    total = ours.attributions.sum(1) + ours.base_values
    torch.testing.assert_close(total, model(x)[:, 2].detach(), atol=1e-12, rtol=0)


def test_the_correlation_linkage_is_shaps() -> None:
    bg = rows(40, 3)
    theirs = shap.maskers.Partition(bg.numpy(), clustering="correlation").clustering
    ours = correlation_tree(bg)
    np.testing.assert_array_equal(ours[:, [0, 1, 3]], theirs[:, [0, 1, 3]])
    np.testing.assert_allclose(ours[:, 2], theirs[:, 2], atol=1e-6)  # shap adds 1e-8 noise


def test_single_linkage_equals_scipys() -> None:
    from scipy.cluster.hierarchy import single
    from scipy.spatial.distance import pdist, squareform

    pts = np.random.default_rng(0).normal(size=(12, 3))
    d = pdist(pts)
    np.testing.assert_allclose(single_linkage(squareform(d)), single(d), atol=1e-12)


@pytest.mark.parametrize("max_evals", [500, 14])
def test_a_given_linkage_and_one_baseline_equal_shaps(max_evals: int) -> None:
    model, x = mlp(2), rows(4, 5)
    base = rows(1, 6)
    z = average(rows(25, 7).numpy().T)  # any scipy linkage over the features
    masker = shap.maskers.Partition(base.numpy(), clustering=z)
    theirs = shap.PartitionExplainer(numpy_model(model), masker)(
        x.numpy(), max_evals=max_evals, outputs=[0], silent=True
    )
    ours = methods.attribute(
        model, x, "partition", target=0, baselines=base, clustering=z, max_evals=max_evals
    )
    np.testing.assert_allclose(ours.attributions.numpy(), theirs.values[..., 0], atol=1e-12)
    np.testing.assert_allclose(ours.base_values.numpy(), theirs.base_values[:, 0], atol=1e-12)


def test_on_a_linear_model_owen_values_are_shapley_values() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(F, 2).double()
    x, bg = rows(3, 1), rows(10, 2)
    owen = methods.attribute(model, x, "partition", target=1, baselines=methods.Background(bg))
    exact = methods.attribute(
        model, x, "shapley_values", target=1, baselines=methods.Background(bg)
    )
    torch.testing.assert_close(owen.attributions, exact.attributions, atol=1e-12, rtol=0)
    torch.testing.assert_close(owen.base_values, exact.base_values, atol=1e-12, rtol=0)


def test_without_a_background_or_linkage_the_features_split_in_halves() -> None:
    """No hierarchy to read: the features' halves in order (shap's axis splits of a row)."""
    model, x = mlp(4), rows(2, 8)
    z = axis_splits((F, 1, 1))
    masker = shap.maskers.Partition(np.zeros((1, F)), clustering=z)
    theirs = shap.PartitionExplainer(numpy_model(model), masker)(
        x.numpy(), max_evals=500, outputs=[1], silent=True
    )
    ours = methods.attribute(model, x, "partition", target=1)
    np.testing.assert_allclose(ours.attributions.numpy(), theirs.values[..., 0], atol=1e-12)


C, H, W = 3, 10, 12


def cnn(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Conv2d(C, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(4 * (H - 2) * (W - 2), 3),
    ).double().eval()  # fmt: skip


@pytest.mark.parametrize("masker", [None, "blur(3,5)", 0.5, 0, "inpaint_telea", "inpaint_ns"])
@pytest.mark.parametrize("max_evals", [100, 600])
def test_images_equal_shaps_image_masker(masker: Any, max_evals: int) -> None:
    model = cnn()
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (2, C, H, W), generator=g).to(torch.float64)  # 0..255 (inpaint)
    fill = "blur(16,16)" if masker is None else masker
    theirs = shap.PartitionExplainer(
        numpy_model(model, (H, W, C)), shap.maskers.Image(fill, (H, W, C))
    )(x.permute(0, 2, 3, 1).numpy(), max_evals=max_evals, outputs=[2], silent=True)
    ours = methods.attribute(
        model, x, "partition", target=2, max_evals=max_evals, image_masker=masker
    )
    mine = ours.attributions.permute(0, 2, 3, 1).numpy()
    np.testing.assert_allclose(mine, theirs.values[..., 0], atol=1e-9)
    np.testing.assert_allclose(ours.base_values.numpy(), theirs.base_values[:, 0], atol=1e-9)


def test_texts_equal_shaps_text_masker() -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from model_registry.hf_text import text_hierarchy
    from tests.hf_dirs import bert_dir

    d = bert_dir(Path(tempfile.mkdtemp()) / "bert")
    tok = AutoTokenizer.from_pretrained(d)
    bert = AutoModelForSequenceClassification.from_pretrained(d).eval().double()

    class Ids(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).logits

    model = Ids()

    def f(a: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.as_tensor(np.asarray(a), dtype=torch.long)).numpy()

    for text in ["the film was great, not dull.", "a very good plot (the acting was bad) but"]:
        for max_evals in (500, 12):
            masker = shap.maskers.Text(tok, output_type="token_ids")
            theirs = shap.PartitionExplainer(f, masker)(
                [text], max_evals=max_evals, outputs=[1], silent=True
            )
            z = text_hierarchy(tok, text)
            np.testing.assert_array_equal(z, masker.clustering(text))
            ids = torch.tensor([tok(text)["input_ids"]])
            special = (ids == tok.cls_token_id) | (ids == tok.sep_token_id)
            base = torch.where(special, ids, torch.full_like(ids, tok.mask_token_id))
            ours = methods.attribute(
                model, ids, "partition", target=1, baselines=base, clustering=z,
                batch_size=5, max_evals=max_evals,
            )  # fmt: skip
            np.testing.assert_allclose(
                ours.attributions[0].numpy(), theirs.values[0][:, 0], atol=1e-12
            )


def test_per_example_linkages_cover_each_examples_own_features() -> None:
    """Texts of other lengths: each example's tree over its own first features, the rest
    (its padding) never masked and credited nothing."""
    model, x = mlp(5), rows(2, 9)
    short = axis_splits((4, 1, 1))
    ours = methods.attribute(
        model, x, "partition", target=0, clustering=[short.tolist(), axis_splits((F, 1, 1))]
    )
    assert torch.all(ours.attributions[0, 4:] == 0)
    alone = methods.attribute(model, x[1:], "partition", target=0)
    torch.testing.assert_close(ours.attributions[1:], alone.attributions, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    ("kwargs", "argument", "says"),
    [
        ({"clustering": [[0, 1, 1.0, 2]]}, "clustering", r"shape \(6, 4\)"),
        ({"clustering": [[0, 9, 1.0, 2]] * 6}, "clustering", "merges node 9"),
        ({"clustering": "correlation"}, "clustering", "background"),
        ({"image_masker": "blur(2,2)"}, "image_masker", "one image input"),
        ({"clustering": [axis_splits((F, 1, 1)).tolist()] * 3}, "clustering", "3 linkages"),
    ],
)
def test_bad_hierarchies_are_refused_naming_the_field(
    kwargs: dict[str, Any], argument: str, says: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=says) as info:
        methods.attribute(mlp(0), rows(2, 0), "partition", target=0, **kwargs)
    assert info.value.argument == argument


@pytest.mark.parametrize("masker", ["blur(0,3)", "blur(3)", "inpaint", float("nan")])
def test_bad_image_maskers_are_refused(masker: Any) -> None:
    x = torch.rand(1, C, H, W, dtype=torch.float64)
    with pytest.raises((InvalidArgumentError, InvalidTypeError), match="image_masker") as info:
        methods.attribute(cnn(), x, "partition", target=0, image_masker=masker)
    assert info.value.argument == "image_masker"
