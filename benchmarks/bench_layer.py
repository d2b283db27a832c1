"""Layer methods, ours vs Captum, side by side in one process (issue: engine III).

Layer integrated gradients on a tiny BERT (token ids, attention mask as an additional forward
argument) and Grad-CAM on a CNN. Run: python -m benchmarks.bench_layer
"""

from __future__ import annotations

import warnings

import torch
from captum.attr import LayerGradCam, LayerGradientXActivation, LayerIntegratedGradients
from torch import nn

import methods
from benchmarks.models import cnn
from benchmarks.timing import compare, max_abs_diff, setup_torch, table


class BertLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import BertConfig, BertForSequenceClassification

        cfg = BertConfig(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            num_labels=2,
        )
        self.m = BertForSequenceClassification(cfg).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, attention_mask=mask).logits


def main() -> None:
    setup_torch()
    warnings.simplefilter("ignore")
    rows: list[list[object]] = []

    bert = BertLogits()
    ids = torch.randint(1, 1000, (4, 32))
    mask = torch.ones_like(ids)
    mask[2:, 24:] = 0
    emb = "m.bert.embeddings.word_embeddings"
    lig = LayerIntegratedGradients(bert, bert.get_submodule(emb))
    for n_steps in (20, 50):

        def ours(n: int = n_steps) -> torch.Tensor:
            return methods.attribute(
                bert,
                ids,
                "layer_integrated_gradients",
                target=1,
                baselines=0,
                additional_forward_args=(mask,),
                layer=emb,
                n_steps=n,
            ).attributions

        def theirs(n: int = n_steps) -> torch.Tensor:
            return lig.attribute(
                ids, baselines=0, target=1, additional_forward_args=(mask,), n_steps=n
            )

        (o, t), ratio = compare([ours, theirs], budget_s=20)
        rows.append(
            [
                f"tiny BERT (2x64, L=32, N=4): layer_integrated_gradients n={n_steps}",
                o,
                t,
                ratio,
                max_abs_diff(ours(), theirs()),
            ]
        )

    model = cnn()
    x = torch.randn(16, 3, 64, 64)
    for layer in ("3", "0"):
        gc = LayerGradCam(model, model.get_submodule(layer))

        def ours_gc(layer: str = layer) -> torch.Tensor:
            return methods.attribute(model, x, "layer_gradcam", target=1, layer=layer).attributions

        def theirs_gc(gc: LayerGradCam = gc) -> torch.Tensor:
            return gc.attribute(x, target=1)

        (o, t), ratio = compare([ours_gc, theirs_gc], budget_s=20)
        rows.append(
            [
                f"CNN 3x64x64, N=16: layer_gradcam layer {layer}",
                o,
                t,
                ratio,
                max_abs_diff(ours_gc(), theirs_gc()),
            ]
        )
    # a list of layers (Captum's multi-layer form): one forward and backward for all of them
    layers = ["0", "3", "6"]
    theirs_gxa = LayerGradientXActivation(model, [model.get_submodule(p) for p in layers])

    def ours_many(name: str = "layer_gradient_x_activation") -> list[torch.Tensor]:
        return methods.attribute(model, x, name, target=1, layer=layers).attributions

    def captum_many() -> list[torch.Tensor]:
        return theirs_gxa.attribute(x, target=1)  # type: ignore[no-any-return]

    (o, t), ratio = compare([ours_many, captum_many], budget_s=20)
    diff = max(max_abs_diff(a, b) for a, b in zip(ours_many(), captum_many(), strict=True))
    rows.append([f"CNN, N=16: layer_gradient_x_activation, layer={layers}", o, t, ratio, diff])

    # LRP (Captum's LayerLRP refuses this CNN's in-place ReLUs): one call vs one per layer
    def lrp_one(p: str) -> torch.Tensor:
        return methods.attribute(model, x, "layer_lrp", target=1, layer=p).attributions

    def lrp_many() -> list[torch.Tensor]:
        return ours_many("layer_lrp")

    def lrp_per_layer() -> list[torch.Tensor]:
        return [lrp_one(p) for p in layers]

    (o, t), ratio = compare([lrp_many, lrp_per_layer], budget_s=20)
    diff = max(max_abs_diff(a, b) for a, b in zip(lrp_many(), lrp_per_layer(), strict=True))
    rows.append(
        [f"CNN, N=16: layer_lrp, layer={layers} (vs ours, one call per layer)", o, t, ratio, diff]
    )
    print(table(["case", "ours ms", "Captum ms", "ratio", "max |diff|"], rows))


if __name__ == "__main__":
    main()
