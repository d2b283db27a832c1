"""A Hugging Face image classifier over HTTP against a loop of Captum calls.

    python -m benchmarks.hf_image [--clients 16] [--images 64] [--n-steps 50]

A small ViT (64×64 images in 8×8 patches, 2 layers, hidden 64, random weights, saved with its
image processor and served with ``source = "hf:DIR"``): integrated gradients on the
processor's ``pixel_values`` for ``--images`` PNG photos of 200×150 pixels. attrserve gets
them from ``--clients`` concurrent clients, one image per request, sent as base64; the
baseline decodes and processes each image and calls Captum's ``IntegratedGradients``, one
image at a time in one process. Images per second, and the ratio. Not a timed test: numbers
depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from benchmarks.hf_text import over_http
from benchmarks.load import start, stop


def build(root: Path) -> Path:
    """The classifier's directory and a models.toml serving it."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=64, patch_size=8, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, num_labels=5)  # fmt: skip
    ViTForImageClassification(cfg).save_pretrained(root / "vit")
    ViTImageProcessor(size={"height": 64, "width": 64}).save_pretrained(root / "vit")
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


def captum_loop(path: Path, files: list[bytes], n_steps: int) -> float:
    """Images per second: decode, process, Captum's IntegratedGradients, one image per call."""
    from captum.attr import IntegratedGradients
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(path).eval()
    processor = AutoImageProcessor.from_pretrained(path)
    ig = IntegratedGradients(lambda x: model(pixel_values=x).logits)

    def one(data: bytes) -> None:
        image = Image.open(io.BytesIO(data)).convert("RGB")
        pixels = processor(images=[image], return_tensors="pt")["pixel_values"]
        ig.attribute(pixels, target=1, n_steps=n_steps)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one(files[0])  # warm up
        t0 = time.perf_counter()
        for data in files:
            one(data)
    return len(files) / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(prog="benchmarks.hf_image", description=__doc__)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--images", type=int, default=64)
    p.add_argument("--n-steps", type=int, default=50)
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads of the Captum loop and of each attrserve worker (0: each's own "
        "default: torch's for Captum, the server's rule for attrserve)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="attrserve workers")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    files = photos(args.images)
    images = [{"image": base64.b64encode(f).decode("ascii")} for f in files]
    with tempfile.TemporaryDirectory() as tmp:
        toml = build(Path(tmp))
        captum = captum_loop(Path(tmp) / "vit", files, args.n_steps)
        settings = {"torch_threads": args.threads} if args.threads else {}
        proc, url = start("attrserve", models=toml, workers=args.workers, **settings)
        try:
            ours = asyncio.run(over_http(url, images, args.clients, args.n_steps, "vit"))
        finally:
            stop(proc)
    print("| case | attrserve images/s | Captum loop images/s | ratio |")
    print("|---|---|---|---|")
    threads = args.threads or "default"
    print(f"| ViT 64px/8, 2x64, {args.images} PNGs of 200x150, IG n_steps={args.n_steps}, "
          f"{args.clients} clients, {args.workers} worker(s), {threads} thread(s) | {ours:.1f} | "
          f"{captum:.1f} | {ours / captum:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
