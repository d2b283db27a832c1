"""Regions in the engine: blur_ig and xrai against PAIR's saliency 0.2.1 (BlurIG, XRAI), and
superpixel feature masks against scikit-image itself and Captum's FeatureAblation."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from captum.attr import FeatureAblation

import methods
from methods.engine import superpixels
from methods.errors import AttributionError, InvalidArgumentError
from methods.generation.units import text_spans
from methods.gradient import xrai
from model_registry.builtin.text import split_words, word_offsets

sc = pytest.importorskip("saliency.core")
skimage_data = pytest.importorskip("skimage.data")


def cnn() -> torch.nn.Module:
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 5, padding=2),
        torch.nn.Tanh(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    ).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
    return model.eval()


def photos() -> list[np.ndarray]:
    """Two photographs ([H, W, 3] in 0..1, float64) of other sizes: real edges to segment."""
    astronaut = skimage_data.astronaut()[::6, ::6].astype(np.float64) / 255
    cat = skimage_data.chelsea()[::6, ::6][:50, :64].astype(np.float64) / 255
    return [astronaut, cat]


def call_model(model: torch.nn.Module) -> Any:
    """saliency's call_model_function: gradients of the target class for a [B, H, W, C] batch."""

    def fn(batch: np.ndarray, call_model_args: Any = None, expected_keys: Any = None) -> Any:
        t = torch.tensor(batch).permute(0, 3, 1, 2).requires_grad_(True)
        (g,) = torch.autograd.grad(model(t)[:, call_model_args].sum(), t)
        return {sc.INPUT_OUTPUT_GRADIENTS: g.permute(0, 2, 3, 1).numpy()}

    return fn


def nchw(photo: np.ndarray) -> torch.Tensor:
    return torch.tensor(photo).permute(2, 0, 1)[None].contiguous()


# --- blur integrated gradients ----------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [{}, {"max_sigma": 5.0, "n_steps": 20, "sqrt": True},
     {"max_sigma": 12.0, "n_steps": 7, "grad_step": 0.1}],
)  # fmt: skip
def test_blur_ig_equals_saliency(params: dict[str, Any]) -> None:
    model = cnn()
    x = torch.cat([nchw(p)[..., :40, :40] for p in photos()])
    got = methods.attribute(model, x, "blur_ig", target=1, internal_batch_size=36, **params)
    for i in range(2):
        want = sc.BlurIG().GetMask(
            x[i].permute(1, 2, 0).numpy(), call_model(model), call_model_args=1,
            max_sigma=params.get("max_sigma", 50), steps=params.get("n_steps", 100),
            grad_step=params.get("grad_step", 0.01), sqrt=params.get("sqrt", False),
        )  # fmt: skip
        np.testing.assert_allclose(got.attributions[i].permute(1, 2, 0).numpy(), want,
                                   rtol=1e-10, atol=1e-14)  # fmt: skip


def test_blur_ig_takes_grey_images_and_refuses_what_it_cannot_blur() -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(100, 2)).double()
    x = torch.rand(2, 10, 10, dtype=torch.float64)
    out = methods.attribute(model, x, "blur_ig", target=0, n_steps=5)
    assert out.attributions.shape == x.shape
    with pytest.raises(InvalidArgumentError, match="no baselines") as err:
        methods.attribute(model, x, "blur_ig", target=0, baselines=0.0)
    assert err.value.argument == "baselines"
    flat = torch.nn.Linear(4, 2).double()
    with pytest.raises(InvalidArgumentError, match="one image input") as err:
        methods.attribute(flat, torch.rand(3, 4, dtype=torch.float64), "blur_ig", target=0)
    assert err.value.argument == "inputs"


# --- XRAI --------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["full", "fast"])
def test_xrai_equals_saliency_with_its_own_segments(algorithm: str) -> None:
    """Integrated gradients from the black and white images, Felzenszwalb's regions at six
    scales: the same map and the same ranking of regions."""
    model = cnn()
    for photo in photos():
        got = methods.attribute(model, nchw(photo), "xrai", target=1, n_steps=12,
                                algorithm=algorithm)  # fmt: skip
        extra = sc.XRAIParameters(steps=12, algorithm=algorithm, return_xrai_segments=True)
        want = sc.XRAI().GetMaskWithDetails(
            photo, call_model(model), call_model_args=1, extra_parameters=extra
        )
        assert got.attributions.shape == (1, 1, *photo.shape[:2])
        np.testing.assert_allclose(got.attributions[0, 0].numpy(), want.attribution_mask,
                                   rtol=1e-6, atol=1e-12)  # fmt: skip
        np.testing.assert_array_equal(got.segments[0].numpy(), want.segments)


def test_xrai_with_given_segments_a_baseline_and_an_area_threshold() -> None:
    model = cnn()
    photo = photos()[1]
    grid = superpixels.segment(photo.transpose(2, 0, 1), {"algorithm": "grid", "size": [10, 16]})
    baseline = np.full_like(photo, 0.5)
    got = methods.attribute(
        model, nchw(photo), "xrai", target=2, n_steps=10, segments=torch.from_numpy(grid),
        baselines=0.5, area_threshold=0.4, min_pixel_diff=20,
    )  # fmt: skip
    extra = sc.XRAIParameters(steps=10, area_threshold=0.4, return_xrai_segments=True)
    extra.experimental_params["min_pixel_diff"] = 20
    masks = [grid == k for k in range(grid.max() + 1)]
    want = sc.XRAI().GetMaskWithDetails(
        photo, call_model(model), call_model_args=2, baselines=[baseline], segments=masks,
        extra_parameters=extra,
    )  # fmt: skip
    np.testing.assert_allclose(got.attributions[0, 0].numpy(), want.attribution_mask,
                               rtol=1e-6, atol=1e-12)  # fmt: skip
    np.testing.assert_array_equal(got.segments[0].numpy(), want.segments)
    # the same regions given as a superpixels spec
    spec = {"superpixels": {"algorithm": "grid", "size": [10, 16]}}
    again = methods.attribute(model, nchw(photo), "xrai", target=2, n_steps=10, segments=spec,
                              baselines=0.5, area_threshold=0.4, min_pixel_diff=20)  # fmt: skip
    torch.testing.assert_close(again.attributions, got.attributions, rtol=0, atol=0)


def test_xrai_refuses_segments_of_another_shape() -> None:
    x = torch.rand(1, 3, 12, 12, dtype=torch.float64)
    with pytest.raises(InvalidArgumentError, match=r"\[H, W\] = \[12, 12\]") as err:
        methods.attribute(cnn(), x, "xrai", target=0, n_steps=2, segments=torch.zeros(5, 5).long())
    assert err.value.argument == "segments"


def test_the_regions_dilate_as_scikit_image_does() -> None:
    from skimage.morphology import dilation, disk

    rng = np.random.default_rng(0)
    masks = [rng.random((30, 41)) > 0.97 for _ in range(12)] + [np.zeros((30, 41), bool)]
    masks[0][0, 0] = masks[1][29, 40] = True
    masks[2][:, 0] = masks[3][0, :] = True
    for radius in (1, 3, 5):
        for got, mask in zip(xrai.dilated(masks, disk(radius)), masks, strict=True):
            np.testing.assert_array_equal(got, dilation(mask, footprint=disk(radius)))


# --- superpixels -------------------------------------------------------------------------------


def same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two label maps draw the same regions (labels aside)."""
    pairs = np.unique(np.stack([a.ravel(), b.ravel()]), axis=1)
    return len(np.unique(pairs[0])) == len(np.unique(pairs[1])) == pairs.shape[1]


@pytest.mark.parametrize(
    ("algorithm", "params"),
    [("slic", {"n_segments": 40, "compactness": 5.0}), ("felzenszwalb", {"scale": 80}),
     ("quickshift", {"kernel_size": 3, "max_dist": 6})],
)  # fmt: skip
def test_superpixels_are_scikit_images_on_the_scaled_image(
    algorithm: str, params: dict[str, Any]
) -> None:
    from skimage import segmentation

    photo = photos()[0]
    chw = (photo.transpose(2, 0, 1) - 0.5) * 3  # a normalised pixel_values: scaled back
    got = superpixels.segment(chw, {"algorithm": algorithm, **params})
    want = getattr(segmentation, algorithm)(photo, channel_axis=-1, **params)
    assert same_partition(got, want)
    assert got.min() == 0 and got.max() == len(np.unique(want)) - 1
    assert got[0, 0] == 0  # numbered in scan order


def test_grid_superpixels_and_one_segmentation_per_distinct_image(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    grid = superpixels.segment(np.zeros((3, 10, 7)), {"algorithm": "grid", "size": [4, 3]})
    assert grid.shape == (10, 7) and grid.max() == 3 * 3 - 1
    assert grid[0, 0] == 0 and grid[0, 3] == 1 and grid[4, 0] == 3 and grid[9, 6] == 8
    seen: list[int] = []
    real = superpixels.segment
    monkeypatch.setattr(superpixels, "segment", lambda im, spec: seen.append(1) or real(im, spec))
    batch = np.stack([photos()[0].transpose(2, 0, 1)] * 3)
    batch[1] *= 0.5
    out = superpixels.segment_batch(batch, {"algorithm": "slic", "n_segments": 20})
    assert len(seen) == 2  # examples 0 and 2 are one image
    np.testing.assert_array_equal(out[0], out[2])


def test_superpixel_feature_masks_give_captums_answer_on_that_mask() -> None:
    model = cnn()
    x = torch.cat([nchw(p)[..., :48, :48] for p in photos()])
    spec = {"superpixels": {"algorithm": "slic", "n_segments": 12}}
    got = methods.attribute(model, x, "feature_ablation", target=[0, 2], feature_mask=spec)
    mask = got.segments
    assert mask.shape == (2, 1, 48, 48) and mask.dtype == torch.int64
    want = FeatureAblation(model).attribute(x, target=[0, 2], feature_mask=mask)
    torch.testing.assert_close(got.attributions, want, rtol=1e-10, atol=1e-12)
    cells = {"superpixels": {"algorithm": "grid", "size": [16, 16]}}
    ks = methods.attribute(model, x, "kernel_shap", target=0, n_samples=40, seed=1,
                           feature_mask=cells)  # fmt: skip
    assert ks.segments.max() == 8  # nine cells


@pytest.mark.parametrize(
    ("spec", "argument", "message"),
    [
        ({"algorithm": "watershed"}, "feature_mask.superpixels.algorithm", "one of slic"),
        ({"algorithm": "slic", "n_segmentz": 4}, "feature_mask.superpixels.n_segmentz",
         "its parameters are n_segments"),
        ({"algorithm": "grid", "size": [0, 4]}, "feature_mask.superpixels.size", "two positive"),
        ({"algorithm": "slic", "n_segments": {"a": 1}}, "feature_mask.superpixels.n_segments",
         "a number"),
        ({"algorithm": "felzenszwalb", "scale": "big"}, "feature_mask.superpixels",
         "refused these parameters"),
    ],
)  # fmt: skip
def test_bad_superpixel_specs_name_the_parameter(
    spec: dict[str, Any], argument: str, message: str
) -> None:
    x = torch.rand(1, 3, 16, 16, dtype=torch.float64)
    with pytest.raises(AttributionError, match=message) as err:
        methods.attribute(cnn(), x, "feature_ablation", target=0,
                          feature_mask={"superpixels": spec})  # fmt: skip
    assert err.value.argument == argument


def test_superpixels_refuse_inputs_that_are_not_images() -> None:
    model = torch.nn.Linear(4, 2).double()
    grid = {"superpixels": {"algorithm": "grid"}}
    with pytest.raises(InvalidArgumentError, match="segment image inputs"):
        methods.attribute(model, torch.rand(2, 4, dtype=torch.float64), "feature_ablation",
                          target=0, feature_mask=grid)  # fmt: skip


@pytest.mark.processes  # a Python without scikit-image
def test_without_scikit_image_the_grid_still_works_and_the_rest_says_how_to_install() -> None:
    code = """
import sys
sys.modules["skimage"] = None
import torch, methods
from methods.errors import AttributionError, InvalidArgumentError
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 2))
x = torch.rand(1, 3, 4, 4)
r = methods.attribute(model, x, "feature_ablation", target=0,
                      feature_mask={"superpixels": {"algorithm": "grid", "size": [2, 2]}})
assert int(r.segments.max()) == 3
try:
    methods.attribute(model, x, "feature_ablation", target=0,
                      feature_mask={"superpixels": {"algorithm": "slic"}})
except InvalidArgumentError as exc:
    print(exc.argument, "|", exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)  # fmt: skip
    argument, message = out.stdout.strip().split(" | ")
    assert argument == "feature_mask.superpixels.algorithm"
    assert "pip install 'attrserve[regions]'" in message


# --- text units --------------------------------------------------------------------------------


def test_text_units_and_word_offsets() -> None:
    text = "Dr. Smith came home. He left!\n\nA new  paragraph here."
    words = [text[a:b] for a, b in text_spans(text, "word")]
    assert words == ["Dr.", "Smith", "came", "home.", "He", "left!", "A", "new", "paragraph",
                     "here."]  # fmt: skip
    assert [text[a:b] for a, b in text_spans(text, "sentence")] == [
        "Dr. Smith came home.", "He left!", "A new  paragraph here."]  # fmt: skip
    assert [text[a:b] for a, b in text_spans(text, "paragraph")] == [
        "Dr. Smith came home. He left!", "A new  paragraph here."]  # fmt: skip
    odd = "İstanbul's CAFÉ — don't!"
    spans = word_offsets(odd)
    assert [odd[a:b].lower() for a, b in spans] == split_words(odd)
