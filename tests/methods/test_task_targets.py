"""The targets of the tasks teams serve, against Captum on its tutorials' wrappers: a class
over a region of a segmentation output (``agg_segmentation_wrapper`` of Captum's segmentation
tutorial: the original prediction's pixels, or a given mask) and per-label sigmoid
probabilities of a multi-label classifier."""

from __future__ import annotations

import captum.attr as ca
import pytest
import torch
from torch import nn

import methods
from methods.errors import AttributionError


class Segmenter(nn.Module):
    """A small fully convolutional segmenter: (N, 3, 12, 12) -> (N, 4, 12, 12) logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU())
        self.head = nn.Conv2d(6, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@pytest.fixture(scope="module", autouse=True)
def _float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def _captum_wrapper(model: nn.Module, x: torch.Tensor, mask: torch.Tensor | None):
    """Captum's tutorial: the class scores summed over the original argmax's pixels of each
    class (or over the given mask)."""
    with torch.no_grad():
        out_max = model(x).argmax(1, keepdim=True)

    def agg(inp: torch.Tensor) -> torch.Tensor:
        out = model(inp)
        if mask is None:
            selected = torch.zeros_like(out[0:1]).scatter_(1, out_max, 1)
        else:
            selected = mask.to(out.dtype).expand_as(out[0:1])
        return (out * selected).sum(dim=(2, 3))

    return agg


CASES = [
    ("integrated_gradients", {"n_steps": 16}, lambda f: ca.IntegratedGradients(f), {"n_steps": 16}),
    ("saliency", {}, lambda f: ca.Saliency(f), {}),
    ("occlusion", {"sliding_window_shapes": (3, 4, 4), "strides": (3, 4, 4)},
     lambda f: ca.Occlusion(f), {"sliding_window_shapes": (3, 4, 4), "strides": (3, 4, 4)}),
]  # fmt: skip


@pytest.mark.parametrize("region", ["predicted", "mask"])
@pytest.mark.parametrize(("method", "params", "captum", "captum_params"), CASES)
def test_region_targets_equal_captums_segmentation_wrapper(
    region, method, params, captum, captum_params
):
    model = Segmenter()
    torch.manual_seed(1)
    x = torch.randn(3, 3, 12, 12)
    mask = torch.zeros(12, 12)
    mask[2:9, 3:10] = 1
    with torch.no_grad():
        out = model(x)
    classes = [int(out[i].argmax(0).flatten().mode().values) for i in range(3)]
    got = methods.attribute(
        model, x, method,
        target={"class": classes, "region": "predicted" if region == "predicted" else mask},
        **params,
    ).attributions  # fmt: skip
    for i in range(3):
        agg = _captum_wrapper(model, x[i : i + 1], None if region == "predicted" else mask)
        want = captum(agg).attribute(x[i : i + 1], target=classes[i], **captum_params)
        # Captum's occlusion rounds its window counts in float32 (its own parity tests' 1e-6)
        tol = 1e-6 if method == "occlusion" else 1e-9
        torch.testing.assert_close(got[i : i + 1], want, rtol=tol, atol=tol)


def test_region_feature_ablation_and_layer_gradcam_equal_captums():
    model = Segmenter()
    torch.manual_seed(2)
    x = torch.randn(2, 3, 12, 12)
    fm = (torch.arange(144).reshape(1, 1, 12, 12) // 37).expand(1, 3, 12, 12).contiguous()
    for i in range(2):
        agg = _captum_wrapper(model, x[i : i + 1], None)
        target = {"class": 1, "region": "predicted"}
        got = methods.attribute(model, x[i : i + 1], "feature_ablation", target=target,
                                feature_mask=fm).attributions  # fmt: skip
        want = ca.FeatureAblation(agg).attribute(x[i : i + 1], target=1, feature_mask=fm)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
        got = methods.attribute(model, x[i : i + 1], "layer_gradcam", target=target,
                                layer="features").attributions  # fmt: skip
        want = ca.LayerGradCam(agg, model.features).attribute(x[i : i + 1], target=1)
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_region_target_errors_name_the_target():
    model = Segmenter()
    x = torch.randn(2, 3, 12, 12)
    with pytest.raises(AttributionError, match="spatial shape"):
        methods.attribute(model, x, "saliency", target={"class": 0, "region": torch.ones(5, 5)})
    with pytest.raises(AttributionError, match="out of range"):
        methods.attribute(model, x, "saliency", target={"class": 9, "region": "predicted"})
    with pytest.raises(AttributionError, match="a region is"):
        methods.attribute(model, x, "saliency", target={"class": 0, "region": "mine"})
    with pytest.raises(AttributionError, match="dense output"):
        methods.attribute(nn.Flatten(), x, "saliency", target={"class": 0, "region": "predicted"})


def test_multi_label_probabilities_are_per_label_sigmoids():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 5))
    x = torch.randn(4, 6)

    def sigmoid(inp: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(model(inp))

    for method, captum in (("integrated_gradients", ca.IntegratedGradients),
                           ("feature_ablation", ca.FeatureAblation)):  # fmt: skip
        got = methods.attribute(
            model, x, method, target=[0, 3, 4, 1], output="probability", multi_label=True
        )
        want = captum(sigmoid).attribute(x, target=[0, 3, 4, 1])
        torch.testing.assert_close(got.attributions, want, rtol=1e-9, atol=1e-9)
    # a softmax over the labels would be another answer: the flag decides
    softmax = methods.attribute(model, x, "saliency", target=0, output="probability")
    sigmoid_ = methods.attribute(model, x, "saliency", target=0, output="probability",
                                 multi_label=True)  # fmt: skip
    want = ca.Saliency(sigmoid).attribute(x, target=0, abs=True)
    torch.testing.assert_close(sigmoid_.attributions, want, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(softmax.attributions, sigmoid_.attributions)
