"""Regions, what they cost: ``python -m benchmarks.regions`` (``--quick``: a tiny model at 64 px).

A ResNet-18 (``transformers``' ResNet, basic blocks, random weights from its config) at 224 px
on a photograph (scikit-image's astronaut), float32, in one process, medians of warm runs:

- superpixels (slic, felzenszwalb, quickshift, grid) as a share of a 224-px occlusion (3x16x16
  windows, stride 8: 729 forwards) and of the feature ablation they serve; a batch of one image
  eight times against eight images (segmented once per distinct image);
- ``xrai`` against integrated gradients alone over the same two baselines and points (what the
  regions add), and against PAIR saliency's ``XRAI`` on the same model;
- ``blur_ig`` against saliency's ``BlurIG``.

Each pair is checked to agree before it is timed. Not a timed test: numbers depend on the
machine.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import methods
from methods.engine import superpixels
from model_registry.hf_image import ImageClassifier

SPECS = {
    "slic": {"algorithm": "slic", "n_segments": 50},
    "felzenszwalb": {"algorithm": "felzenszwalb", "scale": 100},
    "quickshift": {"algorithm": "quickshift", "kernel_size": 5},
    "grid": {"algorithm": "grid", "size": [28, 28]},
}


def model(quick: bool) -> torch.nn.Module:
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    if quick:
        cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1],
                           layer_type="basic", num_labels=5)  # fmt: skip
    else:
        cfg = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512],
                           depths=[2, 2, 2, 2], layer_type="basic", num_labels=5)  # fmt: skip
    return ImageClassifier(ResNetForImageClassification(cfg)).eval()  # as attrserve serves it


def photo(side: int) -> torch.Tensor:
    """The astronaut, resized to ``side`` px, normalised as ImageNet models take it."""
    from skimage import data
    from skimage.transform import resize

    image = resize(data.astronaut(), (side, side), anti_aliasing=True)  # 0..1
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    return torch.tensor(((image - mean) / std).transpose(2, 0, 1), dtype=torch.float32)[None]


def seconds(fn: Callable[[], Any], repeat: int) -> float:
    """The median of ``repeat`` warm runs (one run first, not counted)."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def call_model(m: torch.nn.Module, target: int) -> Any:
    import saliency.core as sc

    def fn(batch: np.ndarray, call_model_args: Any = None, expected_keys: Any = None) -> Any:
        t = torch.tensor(batch, dtype=torch.float32).permute(0, 3, 1, 2).requires_grad_(True)
        (g,) = torch.autograd.grad(m(t)[:, target].sum(), t)
        return {sc.INPUT_OUTPUT_GRADIENTS: g.permute(0, 2, 3, 1).numpy()}

    return fn


def superpixel_rows(m: torch.nn.Module, x: torch.Tensor, repeat: int, quick: bool) -> list[str]:
    side = x.shape[-1]
    window, stride = (3, 16, 16), (3, 8, 8)
    if quick:
        window, stride = (3, 8, 8), (3, 8, 8)
    occlusion = seconds(lambda: methods.attribute(
        m, x, "occlusion", target=1, sliding_window_shapes=window, strides=stride,
        perturbations_per_eval=32), repeat)  # fmt: skip
    rows = []
    image = x.numpy()
    for name, spec in SPECS.items():
        seg = seconds(lambda spec=spec: superpixels.segment_batch(image, spec), repeat)  # type: ignore[misc]
        mask = torch.from_numpy(superpixels.segment_batch(image, spec))[:, None]
        ablation = seconds(lambda mask=mask: methods.attribute(
            m, x, "feature_ablation", target=1, feature_mask=mask, perturbations_per_eval=32),
            repeat)  # fmt: skip
        rows.append(
            f"| {name} | {int(mask.max()) + 1} | {seg * 1e3:.1f} | {occlusion:.3f} | "
            f"{100 * seg / occlusion:.2f}% | {ablation:.3f} | {100 * seg / ablation:.2f}% |"
        )
    batch = np.repeat(image, 8, axis=0)
    distinct = np.concatenate([image * (1 + 0.01 * k) for k in range(8)])
    same = seconds(lambda: superpixels.segment_batch(batch, SPECS["slic"]), repeat)
    apart = seconds(lambda: superpixels.segment_batch(distinct, SPECS["slic"]), repeat)
    return [
        f"\n### Superpixels at {side} px (occlusion {window[1]}x{window[2]}, stride {stride[1]})\n",
        "| algorithm | segments | segmentation ms | occlusion s | share of occlusion "
        "| feature ablation over them s | share of it |",
        "|---|---|---|---|---|---|---|",
        *rows,
        f"\nslic on a batch of one image 8 times: {same * 1e3:.1f} ms; on 8 distinct images: "
        f"{apart * 1e3:.1f} ms (segmented once per distinct image)",
    ]


def xrai_rows(m: torch.nn.Module, x: torch.Tensor, repeat: int, steps: int) -> list[str]:
    import saliency.core as sc

    lo, hi = float(x.min()), float(x.max())
    ours = methods.attribute(m, x, "xrai", target=1, n_steps=steps)
    extra = sc.XRAIParameters(steps=steps, return_xrai_segments=True)
    image = x[0].permute(1, 2, 0).numpy()
    theirs = sc.XRAI().GetMaskWithDetails(image, call_model(m, 1), extra_parameters=extra,
                                          batch_size=steps)  # fmt: skip
    agree = float((ours.segments[0].numpy() == theirs.segments).mean())
    t_xrai = seconds(lambda: methods.attribute(m, x, "xrai", target=1, n_steps=steps), repeat)
    alphas = {"approximation_method": "riemann_trapezoid", "n_steps": steps}

    def ig_alone() -> None:  # the same points: two baselines, n_steps each
        for b in (lo, hi):
            methods.attribute(m, x, "integrated_gradients", target=1, baselines=b, **alphas)

    t_ig = seconds(ig_alone, repeat)
    t_sal = seconds(lambda: sc.XRAI().GetMask(image, call_model(m, 1), extra_parameters=extra,
                                              batch_size=steps), max(1, repeat // 2))  # fmt: skip
    ours_fast = seconds(lambda: methods.attribute(m, x, "xrai", target=1, n_steps=steps,
                                                  algorithm="fast"), repeat)  # fmt: skip
    return [
        f"\n### XRAI, {steps} steps per baseline\n",
        "| | s | x integrated gradients alone |",
        "|---|---|---|",
        f"| integrated gradients alone (2 baselines x {steps} points) | {t_ig:.3f} | 1.00 |",
        f"| attrserve xrai (full) | {t_xrai:.3f} | {t_xrai / t_ig:.2f} |",
        f"| attrserve xrai (fast) | {ours_fast:.3f} | {ours_fast / t_ig:.2f} |",
        f"| saliency 0.2.1 XRAI (full, batch of {steps}) | {t_sal:.3f} | {t_sal / t_ig:.2f} |",
        f"\nattrserve/saliency: {t_xrai / t_sal:.2f}; regions ranked alike on "
        f"{100 * agree:.1f}% of the pixels (float32 on both sides)",
    ]


def blur_rows(m: torch.nn.Module, x: torch.Tensor, repeat: int, steps: int) -> list[str]:
    import saliency.core as sc

    image = x[0].permute(1, 2, 0).numpy()
    ours = methods.attribute(m, x, "blur_ig", target=1, n_steps=steps)
    theirs = sc.BlurIG().GetMask(image, call_model(m, 1), steps=steps, batch_size=1)
    rel = float(np.linalg.norm(ours.attributions[0].permute(1, 2, 0).numpy() - theirs)
                / np.linalg.norm(theirs))  # fmt: skip
    t_ours = seconds(lambda: methods.attribute(m, x, "blur_ig", target=1, n_steps=steps), repeat)
    t_theirs = seconds(lambda: sc.BlurIG().GetMask(image, call_model(m, 1), steps=steps),
                       max(1, repeat // 2))  # fmt: skip
    return [
        f"\n### Blur IG, {steps} steps\n",
        "| | s |",
        "|---|---|",
        f"| saliency 0.2.1 BlurIG (batch of 1: its steps' weights are right only so) "
        f"| {t_theirs:.3f} |",
        f"| attrserve blur_ig | {t_ours:.3f} |",
        f"\nattrserve/saliency: {t_ours / t_theirs:.2f}; relative L2 difference {rel:.1e}",
    ]


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.regions", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a tiny ResNet at 64 px, one run each")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    side, repeat, steps = (64, 1, 8) if args.quick else (224, 3, 50)
    m, x = model(args.quick), photo(side)
    lines = [f"torch threads: {torch.get_num_threads()}"]
    lines += superpixel_rows(m, x, repeat, args.quick)
    lines += xrai_rows(m, x, repeat, steps)
    lines += blur_rows(m, x, repeat, 20 if args.quick else 100)
    for line in lines:
        print(line, flush=True)
    return lines


if __name__ == "__main__":
    main()
