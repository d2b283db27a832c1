"""The tasks teams serve beside classifiers (CONTRACT 9.4), at real size, against the wrapper a
Captum user writes by hand for each (``python -m benchmarks.real --only qa,segformer,detr``):

- ``qa``: BERT-base for question answering at 384 tokens; layer IG of the largest start logit
  on the word embeddings, Captum's BERT SQuAD tutorial (``squad_pos_forward_func``);
- ``segformer``: SegFormer-B0 at 512 px; IG and feature ablation (an 8x8 grid) of a class over
  its predicted pixels, Captum's segmentation tutorial (``agg_segmentation_wrapper``);
- ``detr``: DETR-ResNet-50 at 800 px; feature ablation (a 4x4 grid) of the top detection's
  score, the box scored as pytorch-grad-cam's ``FasterRCNNBoxScoreTarget`` as CONTRACT 9.4
  takes it;
- ``clip``: CLIP ViT-B/32 at 224 px and a 16-token text; integrated gradients of the pair's
  similarity to the pixels and the token embeddings at once (a hook swapping the token
  embeddings, by hand).

Ours runs the serving wrappers (``model_registry.hf_qa``, ``hf_image.Segmenter``,
``detection.BoxScore``) through ``methods.attribute``; Captum runs its tutorials' functions.
Random weights from the default configs (the cost is the architecture's, not the weights').
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

import methods

if TYPE_CHECKING:  # benchmarks.real imports these cases: its names are imported when run
    from benchmarks.real import Row, Sizes


def _grid(size: int, cells: int, device: torch.device) -> tuple[Tensor, int]:
    """A feature mask of ``cells`` x ``cells`` squares over a (1, 3, size, size) image."""
    side = -(-size // cells)
    rows = torch.arange(size, device=device) // side
    mask = (rows[:, None] * cells + rows[None, :]).expand(1, 3, size, size).contiguous()
    return mask, cells * cells


def qa_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import LayerIntegratedGradients
    from transformers import BertConfig, BertForQuestionAnswering

    from benchmarks.real import TINY, Row, plain
    from model_registry.hf_qa import QuestionAnswerer

    torch.manual_seed(0)
    tokens = 384 if not s.tiny else 12
    cfg = BertConfig() if not s.tiny else BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32,
    )  # fmt: skip
    hf = BertForQuestionAnswering(cfg).eval().to(device)
    g = torch.Generator().manual_seed(0)
    cls_, sep = (101, 102) if cfg.vocab_size > 1000 else (1, 2)
    question = tokens // 8
    ids = torch.randint(1000 if cfg.vocab_size > 1000 else 3, cfg.vocab_size, (1, tokens),
                        generator=g)  # fmt: skip
    ids[0, 0], ids[0, question + 1], ids[0, -1] = cls_, sep, sep
    ids = ids.to(device)
    types = torch.zeros_like(ids)
    types[0, question + 2 :] = 1
    ref = torch.where((ids == cls_) | (ids == sep), ids, torch.zeros_like(ids))
    ours_model = QuestionAnswerer(hf, 0, sep, True)

    def squad_pos_forward_func(inputs: Tensor, token_type_ids: Tensor, position: int) -> Tensor:
        pred = hf(inputs, token_type_ids=token_type_ids)
        return pred[position].max(1).values

    layer = hf.bert.embeddings.word_embeddings
    lig = LayerIntegratedGradients(squad_pos_forward_func, layer)

    def ours(prec: str) -> Any:
        return methods.attribute(
            ours_model, ids, "layer_integrated_gradients", target=0, baselines=ref,
            layer="model.bert.embeddings.word_embeddings", n_steps=s.steps, precision=prec,
            internal_batch_size="auto",
        )  # fmt: skip

    def captum() -> Any:
        return lig.attribute(ids, baselines=ref, n_steps=s.steps,
                             additional_forward_args=(types.expand(len(ids), -1), 0))  # fmt: skip

    def score(x: Tensor) -> Tensor:
        return squad_pos_forward_func(x, types.expand(len(x), -1), 0)

    label = f"BERT-base question answering, {tokens} tokens{TINY[s.tiny]}"
    return [
        Row(
            "qa/layer_ig", label, f"layer IG n={s.steps} of the start (word embeddings)", ours,
            captum, plain(score, hf, ids, grad=True, layer=layer), s.steps, 1, twin_of=ours_model,
        ),
    ]  # fmt: skip


def _agg(forward: Callable[[Tensor], Tensor], x: Tensor) -> Callable[[Tensor], Tensor]:
    """Captum's segmentation tutorial's ``agg_segmentation_wrapper`` (the argmax fixed from
    ``x``)."""
    with torch.no_grad():
        out_max = forward(x).argmax(1, keepdim=True)

    def agg_segmentation_wrapper(inp: Tensor) -> Tensor:
        model_out = forward(inp)
        selected = torch.zeros_like(model_out[0:1]).scatter_(1, out_max, 1)
        return (model_out * selected).sum(dim=(2, 3))

    return agg_segmentation_wrapper


def segformer_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import FeatureAblation, IntegratedGradients
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    from benchmarks.real import TINY, Row, plain
    from model_registry.hf_image import Segmenter

    torch.manual_seed(0)
    size = 512 if not s.tiny else 32
    cfg = SegformerConfig(num_labels=150) if not s.tiny else SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=16, num_labels=3,
    )  # fmt: skip
    model = Segmenter(SegformerForSemanticSegmentation(cfg)).eval().to(device)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 3, size, size, generator=g).to(device)
    with torch.no_grad():
        klass = int(model(x).argmax(1).flatten().mode().values)
    target = {"class": klass, "region": "predicted"}
    agg = _agg(model, x)
    mask, features = _grid(size, 8, device)

    def ours(method: str, **kw: Any) -> Callable[[str], Any]:
        return lambda prec: methods.attribute(model, x, method, target=target, precision=prec,
                                              **kw)  # fmt: skip

    def score(v: Tensor) -> Tensor:
        return agg(v)[:, klass]

    def floor(k: int) -> Callable[[], None]:  # five rows a pass, as the runs below
        runs = [plain(score, model, x, grad=True)(min(5, k - i)) for i in range(0, k, 5)]
        return lambda: [run() for run in runs] and None

    label = f"SegFormer-B0 segmentation, {size} px{TINY[s.tiny]}"
    ig, fa = IntegratedGradients(agg), FeatureAblation(agg)
    # 50 steps of 150 classes' 512x512 logits in one pass is 24 GB: both in batches of 5
    steps_at = {"n_steps": s.steps, "internal_batch_size": 5}
    return [
        Row(
            "segformer/integrated_gradients", label,
            f"IG n={s.steps} of a class's pixels (both 5 steps a pass)",
            ours("integrated_gradients", **steps_at),
            lambda: ig.attribute(x, target=klass, **steps_at), floor, s.steps, 1, twin_of=model,
        ),
        Row(
            "segformer/feature_ablation", label, f"feature ablation, {features} squares",
            ours("feature_ablation", feature_mask=mask, perturbations_per_eval="auto"),
            lambda: fa.attribute(x, target=klass, feature_mask=mask),
            plain(score, model, x, grad=False), features + 1, 1, captum_forwards=features + 1,
            twin_of=model,
        ),
    ]  # fmt: skip


def detr_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import FeatureAblation
    from transformers import DetrConfig, DetrForObjectDetection, ResNetConfig

    from benchmarks.real import TINY, Row, plain
    from model_registry.detection import BoxScore, box_score

    torch.manual_seed(0)
    size = 800 if not s.tiny else 64
    backbone = ResNetConfig(out_features=["stage4"], depths=[3, 4, 6, 3], layer_type="bottleneck",
                            hidden_sizes=[256, 512, 1024, 2048])  # fmt: skip
    if s.tiny:
        backbone = ResNetConfig(out_features=["stage2"], depths=[1, 1], hidden_sizes=[8, 16],
                                embedding_size=8, layer_type="basic")  # fmt: skip
    cfg = DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, num_labels=91,
                     backbone_config=backbone)  # fmt: skip
    if s.tiny:
        cfg.d_model, cfg.encoder_layers, cfg.decoder_layers, cfg.num_queries = 16, 1, 1, 10
        cfg.encoder_ffn_dim = cfg.decoder_ffn_dim = 32
        cfg.encoder_attention_heads = cfg.decoder_attention_heads = 2
    hf = DetrForObjectDetection(cfg).eval().to(device)
    model = BoxScore(hf, hf=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 3, size, size, generator=g).to(device)
    with torch.no_grad():
        (det,) = model.detect(x)
    k = int(det["scores"].argmax())
    box, label = det["boxes"][k][None], det["labels"][k][None]

    def grad_cam_target(v: Tensor) -> Tensor:  # the hand-written scorer
        out = hf(pixel_values=v)
        probs = out.logits.softmax(-1)[..., :-1]
        scores, labels = probs.max(-1)
        cx, cy, w, h = out.pred_boxes.unbind(-1)
        boxes = torch.stack([(cx - w / 2) * size, (cy - h / 2) * size, (cx + w / 2) * size,
                             (cy + h / 2) * size], -1)  # fmt: skip
        return torch.stack([
            box_score({"boxes": boxes[i], "labels": labels[i], "scores": scores[i]}, box[0],
                      label[0], 0.5) for i in range(len(v))
        ])  # fmt: skip

    mask, features = _grid(size, 4, device)
    fa = FeatureAblation(grad_cam_target)

    def ours(prec: str) -> Any:
        return methods.attribute(model, x, "feature_ablation", feature_mask=mask,
                                 additional_forward_args=(box, label, 0.5), precision=prec,
                                 perturbations_per_eval="auto")  # fmt: skip

    name = f"DETR-ResNet-50 detection, {size} px{TINY[s.tiny]}"
    return [
        Row(
            "detr/feature_ablation", name, f"feature ablation of the top box, {features} squares",
            ours, lambda: fa.attribute(x, feature_mask=mask),
            plain(grad_cam_target, hf, x, grad=False), features + 1, 1,
            captum_forwards=features + 1, twin_of=model,
        ),
    ]  # fmt: skip


def clip_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import IntegratedGradients
    from transformers import CLIPConfig, CLIPModel

    from benchmarks.real import TINY, Row, plain
    from model_registry.hf_clip import ImageTextSimilarity

    torch.manual_seed(0)
    cfg = CLIPConfig()  # ViT-B/32 and its text tower
    size, tokens = 224, 16
    if s.tiny:
        cfg = CLIPConfig(
            text_config={"vocab_size": 30, "hidden_size": 16, "intermediate_size": 32,
                         "num_hidden_layers": 1, "num_attention_heads": 2,
                         "max_position_embeddings": 16, "bos_token_id": 1, "eos_token_id": 29,
                         "pad_token_id": 0},
            vision_config={"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
            projection_dim=8,
        )  # fmt: skip
        size, tokens = 32, 8
    hf = CLIPModel(cfg).eval().to(device)
    eos = int(cfg.text_config.eos_token_id)
    model = ImageTextSimilarity(hf, eos)
    g = torch.Generator().manual_seed(3)
    vocab = int(cfg.text_config.vocab_size)
    ids = torch.randint(3, min(vocab, 40000), (1, tokens), generator=g)
    ids[0, 0], ids[0, -1] = int(cfg.text_config.bos_token_id), eos
    ids = ids.to(device)
    base = torch.where((ids == ids[0, 0]) | (ids == eos), ids, torch.full_like(ids, eos))
    pixels = torch.randn(1, 3, size, size, generator=g).to(device)
    emb = hf.text_model.embeddings.token_embedding
    with torch.no_grad():
        embeds, base_embeds = emb(ids), emb(base)

    def by_hand(px: Tensor, e: Tensor) -> Tensor:  # a Captum user's wrapper
        handle = emb.register_forward_hook(lambda _m, _i, _o: e)
        try:
            out = hf(pixel_values=px, input_ids=ids.expand(len(px), -1))
        finally:
            handle.remove()
        return out.logits_per_image.diagonal()

    ig = IntegratedGradients(by_hand)
    zeros = torch.zeros_like(pixels)

    def ours(prec: str) -> Any:
        def along(px: Tensor, e: Tensor, at: Tensor) -> Tensor:
            return model(px, at, e)

        return methods.attribute(
            along, (pixels, embeds), "integrated_gradients", baselines=(zeros, base_embeds),
            additional_forward_args=(ids,), n_steps=s.steps, internal_batch_size="auto",
            precision=prec,
        )  # fmt: skip

    def captum() -> Any:
        return ig.attribute((pixels, embeds), baselines=(zeros, base_embeds), n_steps=s.steps)

    def score(px: Tensor) -> Tensor:
        return by_hand(px, embeds.expand(len(px), -1, -1))

    label = f"CLIP ViT-B/32 image-text, {size} px and {tokens} tokens{TINY[s.tiny]}"
    return [
        Row(
            "clip/integrated_gradients", label, f"IG n={s.steps} of pixels and tokens at once",
            ours, captum, plain(score, hf, pixels, grad=True), s.steps, 1, twin_of=model,
        ),
    ]  # fmt: skip


#: case name -> its rows
CASES: dict[str, Callable[[Sizes, torch.device], list[Row]]] = {
    "qa": qa_rows,
    "segformer": segformer_rows,
    "detr": detr_rows,
    "clip": clip_rows,
}
