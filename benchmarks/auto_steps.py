"""How many evaluations ``n_steps="auto"`` takes for what error, on real-size models.

    python -m benchmarks.auto_steps [--device cpu|cuda] [--tiny]

For BERT-base (layer integrated gradients on the embeddings, one 64-token text), ViT-B/16 and
ResNet-50 (integrated gradients on one 224 px image), built from transformers' default configs
with random weights: the reference is 50-step Gauss-Legendre, Captum's default; each row is a
rule and tolerance, with the steps it stopped at, the gradient evaluations it paid (a nested
rule pays only the points it stops at; Gauss-Legendre's rungs share none), the evaluations
relative to the fixed 50, the relative L2 distance of its attributions from the reference, and
what stopped it ("delta": the delta met and the last rung moved them by less than the
tolerance; "stable": the rungs agree ten times closer though the delta is not met).
"""

from __future__ import annotations

import argparse
import time
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

import methods
from benchmarks.real import sync
from benchmarks.timing import table
from methods.engine.precision import compare


class Logits(nn.Module):
    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.model(**{self.key: x}).logits
        return out


def cases(device: torch.device, tiny: bool) -> list[tuple[str, nn.Module, Tensor, dict[str, Any]]]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        ResNetConfig,
        ResNetForImageClassification,
        ViTConfig,
        ViTForImageClassification,
    )

    torch.manual_seed(0)
    small = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 32}  # fmt: skip
    bert_cfg = BertConfig(vocab_size=100, **small) if tiny else BertConfig()
    vit_cfg = ViTConfig(image_size=32, patch_size=8, **small) if tiny else ViTConfig()
    res_cfg = (
        ResNetConfig(depths=[1, 1, 1, 1], hidden_sizes=[8, 8, 8, 8]) if tiny else ResNetConfig()
    )
    size = 32 if tiny else 224
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000 if not tiny else 1, bert_cfg.vocab_size, (1, 64), generator=g)
    image = torch.rand(1, 3, size, size, generator=g)
    bert = Logits(BertForSequenceClassification(bert_cfg).eval(), "input_ids").to(device)
    vit = Logits(ViTForImageClassification(vit_cfg).eval(), "pixel_values").to(device)
    resnet = Logits(ResNetForImageClassification(res_cfg).eval(), "pixel_values").to(device)
    base = {"baselines": torch.zeros_like(ids).to(device), "layer": "model.bert.embeddings"}
    return [
        ("BERT-base, 64 tokens (layer IG)", bert, ids.to(device), base),
        (f"ViT-B/16, {size} px (IG)", vit, image.to(device), {}),
        (f"ResNet-50, {size} px (IG)", resnet, image.to(device), {}),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.auto_steps", description=__doc__)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the tests' sizes
    p.add_argument("--precision", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="the precision every run computes in (the reference's too)")  # fmt: skip
    args = p.parse_args(argv)
    device = torch.device(args.device)

    def timed(fn: Any) -> tuple[Any, float]:
        sync(device)
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        return out, time.perf_counter() - t0

    rows = []
    for label, model, x, kw in cases(device, args.tiny):
        method = "layer_integrated_gradients" if "layer" in kw else "integrated_gradients"
        common = {"target": 1, "internal_batch_size": "auto", "precision": args.precision, **kw}
        fixed = partial(methods.attribute, model, x, method, n_steps=50, **common)
        fixed()  # warm: the first call's allocations (and the low-precision copy)
        ref, fixed_s = timed(fixed)
        rows.append([label, "gausslegendre (fixed)", "-", 50, 50, 1.0, 0.0, "-", fixed_s, 1.0])
        for rule in ("clenshaw_curtis", "gausslegendre"):
            for tol in (1e-2, 1e-3):
                run = partial(methods.attribute, model, x, method, n_steps="auto",
                              delta_tolerance=tol, approximation_method=rule, **common)  # fmt: skip
                if device.type == "cuda":  # a new chunk shape's first call builds its kernels'
                    run()  # plans (cuDNN attention): 0.1-0.2 s on an H200, once per shape
                res, took = timed(run)
                ev = res.params["n_steps_evaluated"]
                rows.append([
                    label, rule, tol, res.params["n_steps"], ev, ev / 50,
                    compare(res.attributions, ref.attributions)[0], res.params["stopped"], took,
                    took / fixed_s,
                ])  # fmt: skip
    headers = ["model", "rule", "delta tolerance", "steps", "evaluations", "evaluations / 50",
               "rel L2 vs GL-50", "stopped by", "seconds", "seconds / fixed 50's"]  # fmt: skip
    print(f"\n## n_steps='auto' vs 50-step Gauss-Legendre ({device.type}, {args.precision})\n")
    print(table(headers, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
