"""A Hugging Face image classifier over HTTP against a loop of Captum calls.

    python -m benchmarks.hf_image [--clients 16] [--images 64] [--n-steps 50]

A small ViT (64×64 images in 8×8 patches, 2 layers, hidden 64, random weights, saved with its
image processor and served with ``source = "hf:DIR"``): integrated gradients on the
processor's ``pixel_values`` for ``--images`` PNG photos of 200×150 pixels. attrserve gets
them from ``--clients`` concurrent clients, one image per request, sent as base64. Two
peers: a loop that decodes and processes each image and calls Captum's
``IntegratedGradients``, one image at a time in one process (no HTTP cost), and the naive
server (FastAPI + the same per request, ``hf_text.naive_app``), which gets the same requests
from the same clients. Images per second, and the ratios. Not a timed test: numbers depend
on the machine.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks import hf_text


def build(root: Path, size: str = "tiny") -> Path:
    """The classifier's directory and a models.toml serving it: ``tiny`` (64 px in 8 px
    patches, 2 layers of 64) or ``base`` (ViT-B/16's default config: 224 px, 12 layers of
    768, 86M parameters)."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    if size == "base":
        cfg, side = ViTConfig(num_labels=5), 224
    else:
        cfg = ViTConfig(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, num_labels=5)  # fmt: skip
        side = 64
    ViTForImageClassification(cfg).save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": side, "width": side}).save_pretrained(root / "vit")
    (root / "models.toml").write_text('[[models]]\nid = "vit"\nsource = "hf:vit"\n')
    return root / "models.toml"


def photos(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        buf = io.BytesIO()
        pixels = rng.integers(0, 256, (150, 200, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def captum_one(path: Path, n_steps: int) -> Callable[[bytes], np.ndarray]:
    """Decode and process one image, then Captum's IntegratedGradients on it: its
    attributions."""
    from captum.attr import IntegratedGradients
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(path).eval()
    processor = AutoImageProcessor.from_pretrained(path)
    ig = IntegratedGradients(lambda x: model(pixel_values=x).logits)

    def one(data: bytes) -> np.ndarray:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
        return ig.attribute(pixels, target=1, n_steps=n_steps)[0].detach().numpy()

    return one


def main() -> None:
    args = hf_text.arguments("benchmarks.hf_image", __doc__, "images", 64)
    if args.serve_naive:  # requests carry {"image": base64}, as attrserve's do
        one = captum_one(Path(args.serve_naive[0]), args.n_steps)
        hf_text.serve_naive(args, lambda example: one(base64.b64decode(example["image"])))
        return
    files = photos(args.count)
    images = [{"image": base64.b64encode(f).decode("ascii")} for f in files]
    ours, captum, naive, rel = hf_text.compare(
        args, "benchmarks.hf_image", build,
        lambda path, n: hf_text.timed_loop(captum_one(path, n), files), images, "vit",
    )  # fmt: skip
    name = "ViT-B/16 224px" if args.size == "base" else "ViT 64px/8, 2x64"
    hf_text.table(args, "images", f"{name}, {args.count} PNGs of 200x150, IG "
                  f"n_steps={args.n_steps}", ours, captum, naive, rel)  # fmt: skip


if __name__ == "__main__":
    main()
