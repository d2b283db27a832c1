"""Tiny Hugging Face classifier directories, built from configs and saved as a team saves its
own (``save_pretrained``: config, safetensors weights, tokenizer files): what the test suite
serves with ``source = "hf:DIR"``, and what the README's walk-through serves.

    python -m tests.hf_dirs /tmp/hf     # /tmp/hf/{reviews,ner,flowers}, models.toml, photos/

The weights are random (the point is the path, not the model): replace the directories with
your own.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "film", "was", "great", "dull",
         "a", "plot", "good", "bad", "not", "very", "acting", "story"]  # fmt: skip
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
NER_LABELS = {0: "O", 1: "PER", 2: "LOC"}
FLOWERS = {0: "tulip", 1: "rose", 2: "daisy"}
TOPICS = {0: "acting", 1: "plot", 2: "music"}
SCENE = {0: "sky", 1: "field", 2: "flower"}
PETS = {0: "cat", 1: "dog", 2: "bird"}

MODELS_TOML = """\
[[models]]
id = "reviews"
source = "hf:reviews"   # BertForSequenceClassification: a label per text (or text pair)

[[models]]
id = "ner"
source = "hf:ner"       # DistilBertForTokenClassification: a label per token

[[models]]
id = "flowers"
source = "hf:flowers"   # ViTForImageClassification: a label per image
"""


def bert_dir(path: Path, *, tokenizer: bool = True, positions: int = 16) -> Path:
    """A tiny random BERT text classifier with its tokenizer (``tokenizer=False``: without)."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=positions, num_labels=3,
        id2label=LABELS, label2id={v: k for k, v in LABELS.items()}, initializer_range=0.5,
    )  # fmt: skip
    BertForSequenceClassification(cfg).save_pretrained(path)
    if tokenizer:  # transformers 5: a vocab dict (vocab_file may be ignored silently)
        BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(path)
    return path


def ner_dir(path: Path) -> Path:
    """A tiny random DistilBERT token classifier (no token type ids) with its tokenizer."""
    from transformers import (
        DistilBertConfig,
        DistilBertForTokenClassification,
        DistilBertTokenizerFast,
    )

    torch.manual_seed(1)
    cfg = DistilBertConfig(
        vocab_size=len(WORDS), dim=16, n_layers=1, n_heads=2, hidden_dim=32,
        max_position_embeddings=16, num_labels=3, id2label=NER_LABELS,
        label2id={v: k for k, v in NER_LABELS.items()}, initializer_range=0.5,
    )  # fmt: skip
    DistilBertForTokenClassification(cfg).save_pretrained(path)
    DistilBertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(path)
    return path


def vit_dir(path: Path, *, processor: Any = "vit", size: int = 32) -> Path:
    """A tiny random ViT image classifier with its image processor saved beside it
    (``processor``: "vit" resizes to ``size``, "crop" resizes larger and crops the centre,
    None: no processor, or one to save)."""
    from transformers import (
        DeiTImageProcessor,
        ViTConfig,
        ViTForImageClassification,
        ViTImageProcessor,
    )

    torch.manual_seed(2)
    cfg = ViTConfig(
        image_size=size, patch_size=8, hidden_size=16, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=32, num_labels=3, id2label=FLOWERS,
        label2id={v: k for k, v in FLOWERS.items()}, initializer_range=0.5,
    )  # fmt: skip
    ViTForImageClassification(cfg).save_pretrained(path)
    if processor == "vit":
        processor = ViTImageProcessor(size={"height": size, "width": size})
    elif processor == "crop":
        big = {"height": size + size // 4, "width": size + size // 4}
        processor = DeiTImageProcessor(size=big, crop_size={"height": size, "width": size})
    if processor is not None:
        processor.save_pretrained(path)
    return path


def bert_task_dir(path: Path, task: str, positions: int = 64) -> Path:
    """A tiny random BERT of another task (CONTRACT 9.4) with its tokenizer: "qa"
    (BertForQuestionAnswering), "multi_label" and "regression" (BertForSequenceClassification
    with that ``problem_type``)."""
    from transformers import (
        BertConfig,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertTokenizerFast,
    )

    torch.manual_seed(3)
    extra: dict[str, Any] = {}
    if task == "multi_label":
        extra = {"num_labels": 3, "problem_type": "multi_label_classification",
                 "id2label": TOPICS, "label2id": {v: k for k, v in TOPICS.items()}}  # fmt: skip
    elif task == "regression":
        extra = {"num_labels": 1, "problem_type": "regression"}
    cfg = BertConfig(
        vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=positions, initializer_range=0.5, **extra,
    )  # fmt: skip
    model = BertForQuestionAnswering(cfg) if task == "qa" else BertForSequenceClassification(cfg)
    model.save_pretrained(path)
    BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(path)
    return path


def segformer_dir(path: Path, size: int = 32) -> Path:
    """A tiny random SegFormer (logits at a quarter of the input, upsampled by the service)
    with its image processor resizing to ``size``."""
    from transformers import (
        SegformerConfig,
        SegformerForSemanticSegmentation,
        SegformerImageProcessor,
    )

    torch.manual_seed(4)
    cfg = SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16],
        patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
        decoder_hidden_size=16, num_labels=3, id2label=SCENE,
        label2id={v: k for k, v in SCENE.items()}, initializer_range=0.5,
    )  # fmt: skip
    SegformerForSemanticSegmentation(cfg).save_pretrained(path)
    SegformerImageProcessor(size={"height": size, "width": size}).save_pretrained(path)
    return path


def yolos_dir(path: Path, size: int = 32) -> Path:
    """A tiny random YOLOS detector (DETR-style logits and boxes per detection token) with
    its image processor resizing to ``size``."""
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(6)
    cfg = YolosConfig(
        image_size=[size, size], patch_size=8, hidden_size=16, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=32, num_detection_tokens=5, num_labels=3,
        id2label=PETS, label2id={v: k for k, v in PETS.items()}, initializer_range=0.5,
    )  # fmt: skip
    YolosForObjectDetection(cfg).save_pretrained(path)
    YolosImageProcessor(size={"height": size, "width": size}, do_pad=False).save_pretrained(path)
    return path


def clip_dir(path: Path, size: int = 32) -> Path:
    """A tiny random CLIP (image and text towers) with a word-piece tokenizer ([CLS] ...
    [SEP], [SEP] its end of text) and an image processor cropping to ``size``."""
    from transformers import BertTokenizerFast, CLIPConfig, CLIPImageProcessor, CLIPModel

    torch.manual_seed(7)
    text = {"vocab_size": len(WORDS), "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16,
            "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 3}  # fmt: skip
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
              "num_attention_heads": 2, "image_size": size, "patch_size": 8}  # fmt: skip
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=8)).save_pretrained(
        path
    )
    BertTokenizerFast(vocab={w: i for i, w in enumerate(WORDS)}).save_pretrained(path)
    CLIPImageProcessor(size={"shortest_edge": size},
                       crop_size={"height": size, "width": size}).save_pretrained(path)  # fmt: skip
    return path


def sample_photo() -> Any:
    """A 120×90 picture: a green field under a blue sky, a red flower left of the centre."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (120, 90), (110, 170, 235))
    pen = ImageDraw.Draw(image)
    pen.rectangle((0, 55, 119, 89), fill=(70, 150, 60))
    pen.line((40, 40, 40, 75), fill=(40, 110, 40), width=3)
    pen.ellipse((30, 28, 50, 48), fill=(220, 40, 60))
    return image


def build(root: Path) -> Path:
    """The three directories under ``root`` and a models.toml serving them; the models.toml."""
    root.mkdir(parents=True, exist_ok=True)
    bert_dir(root / "reviews")
    ner_dir(root / "ner")
    vit_dir(root / "flowers")
    photos = root / "photos"  # a photo to send the image classifier
    photos.mkdir(exist_ok=True)
    sample_photo().save(photos / "photo.png")
    (root / "models.toml").write_text(MODELS_TOML)
    return root / "models.toml"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.hf_dirs",
        description="Build tiny random Hugging Face classifier directories (reviews, ner, "
        "flowers), a photo and a models.toml serving them; print the models.toml's path.",
    )
    parser.add_argument(
        "root", nargs="?", default="hf-demo", type=Path, help="where to build (default: hf-demo)"
    )
    print(build(parser.parse_args(argv).root))


if __name__ == "__main__":
    main()
