"""The built-in demo models (README, "Built-in demo models"), each with a ground truth to find.

The architectures and synthetic data live in ``tabular``, ``image`` and ``text``; ``train``
regenerates the committed weights in ``weights/``. Serving only loads those weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from model_registry.builtin import image, lm, noisy, tabular, text
from model_registry.errors import RegistryError
from model_registry.influence import InfluenceSpec
from model_registry.spec import InputSpec, ModelSpec, OutputSpec

WEIGHTS_DIR = Path(__file__).parent / "weights"


@dataclass(frozen=True)
class Builtin:
    """What the registry needs to describe and build one built-in model."""

    name: str
    description: str
    build: Callable[[], nn.Module]
    inputs: tuple[InputSpec, ...]
    labels: tuple[str, ...]
    layers: tuple[str, ...]
    embedding_layer: str | None = None
    tokenizer: Callable[[], Any] | None = None
    task: str = "tensor"
    #: its ``[models.influence]``: the shipped training data and checkpoints
    influence: InfluenceSpec | None = None
    #: TCAV demo concept sets, stored for the model when a server starts: their names, and
    #: what makes them (name -> examples), called only when one of them is missing
    concepts: tuple[tuple[str, ...], Callable[[], dict[str, Any]]] | None = None

    def spec(self) -> ModelSpec:
        output = OutputSpec(shape=(len(self.labels),), labels=self.labels)
        if self.task == "causal_lm":  # next-token logits per position
            output = OutputSpec(shape=(None, len(lm.VOCAB)))
        return ModelSpec(
            id=self.name,
            version="1",
            description=self.description,
            source=f"builtin:{self.name}",
            device="auto",
            dtype="float32",
            inputs=self.inputs,
            output=output,
            layers=self.layers,
            embedding_layer=self.embedding_layer,
            task=self.task,
            influence=self.influence,
        )


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin(
            name="tabular-mlp",
            description="Demo MLP on 8 features, 3 classes (low/mid/high); only features 0 and 3 "
            "decide the class: x0 + x3 below -0.6 is low, above 0.6 high, else mid.",
            build=tabular.TabularMLP,
            inputs=(InputSpec("x", "float32", (None, tabular.N_FEATURES), tabular.FEATURES),),
            labels=tabular.LABELS,
            layers=tabular.LAYERS,
        ),
        Builtin(
            name="tabular-noisy",
            description="tabular-mlp's task trained by SGD on 512 rows, 12 of them with a "
            "deliberately wrong label; serves influence (TracInCP over its shipped training "
            "data and 3 checkpoints): GET /v1/models/tabular-noisy/influence/self lists the "
            "wrong labels first.",
            build=tabular.TabularMLP,
            inputs=(InputSpec("x", "float32", (None, tabular.N_FEATURES), tabular.FEATURES),),
            labels=tabular.LABELS,
            layers=tabular.LAYERS,
            influence=InfluenceSpec(
                train_data=str(noisy.FILES / "train.npz"),
                checkpoints=tuple(
                    (str(noisy.FILES / f"checkpoint-{i}.pt"), lr)
                    for i, lr in enumerate(noisy.LRS, 1)
                ),
            ),
        ),
        Builtin(
            name="image-cnn",
            description="Demo CNN on 3x32x32 images, 4 classes: the quadrant (top-left, "
            "top-right, bottom-left, bottom-right) holding a bright square on dim noise.",
            build=image.ImageCNN,
            inputs=(InputSpec("image", "float32", (None, 3, image.SIZE, image.SIZE)),),
            labels=image.LABELS,
            layers=image.LAYERS,
            concepts=(image.CONCEPT_NAMES, image.concept_sets),
        ),
        Builtin(
            name="text-classifier",
            description="Demo sentiment classifier on token ids (or raw text via its word "
            "tokenizer), 2 classes (negative, positive) decided by sentiment words such as "
            "'great' or 'awful'.",
            build=text.TextClassifier,
            inputs=(InputSpec("ids", "int64", (None, None)),),
            labels=text.LABELS,
            layers=text.LAYERS,
            embedding_layer=text.EMBEDDING_LAYER,
            tokenizer=text.WordTokenizer,
        ),
        Builtin(
            name="tiny-lm",
            description="Demo causal language model (2 layers, word-level tokenizer) trained on "
            "'<name> lives in <city>' facts: attributing the city it answers to the prompt puts "
            "most of the score on the name.",
            build=lm.TinyLM,
            inputs=(InputSpec("ids", "int64", (None, None)),),
            labels=(),
            layers=("embed", "blocks.0", "blocks.1"),
            embedding_layer=lm.EMBEDDING_LAYER,
            tokenizer=lm.TinyTokenizer,
            task="causal_lm",
        ),
    )
}


def specs() -> list[ModelSpec]:
    """The built-in demo registry (what is served without a models.toml)."""
    return [b.spec() for b in BUILTINS.values()]


def build(name: str, weights: Path | None = None) -> tuple[nn.Module, Any]:
    """The built-in model ``name`` with its weights (committed ones unless ``weights``), on CPU.

    Returns the module (in float32, train mode as built) and its tokenizer or None.
    """
    b = BUILTINS[name]
    path = weights if weights is not None else WEIGHTS_DIR / f"{name}.safetensors"
    if not path.is_file():
        raise RegistryError(
            f"weights file {str(path)!r} not found; regenerate the built-in weights with "
            "`python -m model_registry.builtin.train`",
            model=name,
            field="weights",
        )
    tokenizer = b.tokenizer() if b.tokenizer is not None else None
    if tokenizer is not None:
        _check_vocab(path, tokenizer.vocab, name)
    module = b.build()
    try:
        module.load_state_dict(load_file(str(path), device="cpu"))
    except (RuntimeError, OSError, ValueError) as e:
        raise RegistryError(
            f"weights file {str(path)!r} does not fit the built-in {name}: {e}",
            model=name,
            field="weights",
        ) from e
    return module, tokenizer


def _check_vocab(path: Path, vocab: tuple[str, ...], name: str) -> None:
    # Embedding rows are indexed by vocabulary position: weights trained for another vocabulary
    # load without complaint and then give quietly wrong answers, so compare what was stored.
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads((f.metadata() or {}).get("attrserve", "{}"))
    stored = meta.get("vocab")
    if stored is not None and tuple(stored) != vocab:
        raise RegistryError(
            f"weights file {str(path)!r} was trained for a different vocabulary than the "
            "built-in tokenizer's; regenerate with `python -m model_registry.builtin.train`",
            model=name,
            field="weights",
        )
