"""``hf:DIRECTORY``: a local Hugging Face model directory (config, safetensors weights,
tokenizer files), loaded with ``transformers`` (the ``attrserve[hf]`` extra), never from the
network.

The model's task comes from the config's ``architectures``, read as plain JSON when models.toml
is read (no transformers needed for that): each architecture's class name is matched by its
ending in ``ARCHITECTURES``, and the task's ``transformers`` Auto class loads it. A new task of
Hugging Face model is an entry in each of the two tables (and the task in ``tasks``)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

from model_registry import hf_clip, hf_config, hf_image, hf_qa, hf_text
from model_registry.detection import BoxScore
from model_registry.errors import RegistryError
from model_registry.sources.base import ModelSource, Source, register
from model_registry.spec import InputSpec, ModelSpec, OutputSpec
from model_registry.table import Table
from model_registry.task_loaders import Built, finish_detection, finish_tensor
from model_registry.tasks import TASKS

#: how an architecture's class name ends → the model task it is served as
ARCHITECTURES: Mapping[str, str] = MappingProxyType(
    {
        "ForCausalLM": "causal_lm",
        "LMHeadModel": "causal_lm",
        # encoder-decoders (T5, BART, Marian, ...): the prompt is the source
        "ForConditionalGeneration": "seq2seq_lm",
        "ForSeq2SeqLM": "seq2seq_lm",
        # text classifiers (texts and text pairs; per text or per token) are tensor models of
        # token ids, image classifiers of their image processor's pixel_values
        "ForSequenceClassification": "text_classification",
        "ForTokenClassification": "token_classification",
        "ForImageClassification": "image_classification",
        # the tasks teams serve beside classifiers (CONTRACT 9.4)
        "ForQuestionAnswering": "question_answering",
        "ForSemanticSegmentation": "semantic_segmentation",
        "ForObjectDetection": "object_detection",
        "CLIPModel": "image_text_similarity",
    }
)
#: a sequence classifier's config ``problem_type`` → the task it is served as
PROBLEM_TYPES: Mapping[str, str] = MappingProxyType(
    {"multi_label_classification": "multi_label_classification", "regression": "regression"}
)
#: the ``transformers`` Auto class that loads each task
AUTO_CLASSES: Mapping[str, str] = MappingProxyType(
    {
        "causal_lm": "AutoModelForCausalLM",
        "seq2seq_lm": "AutoModelForSeq2SeqLM",
        "text_classification": hf_text.AUTO_CLASS,
        "token_classification": hf_text.TOKEN_AUTO_CLASS,
        "image_classification": hf_image.AUTO_CLASS,
        "multi_label_classification": hf_text.AUTO_CLASS,
        "regression": hf_text.AUTO_CLASS,
        "question_answering": hf_text.QA_AUTO_CLASS,
        "semantic_segmentation": hf_image.SEGMENTATION_AUTO_CLASS,
        "object_detection": hf_image.DETECTION_AUTO_CLASS,
        "image_text_similarity": "CLIPModel",
    }
)


def architecture_task(name: str, problem_type: Any = None) -> str | None:
    """The task an architecture's class name is served as (a sequence classifier's by its
    config's ``problem_type``: multi-label, regression); None: not served."""
    task = next((task for end, task in ARCHITECTURES.items() if name.endswith(end)), None)
    if task == "text_classification" and isinstance(problem_type, str):
        return PROBLEM_TYPES.get(problem_type, task)
    return task


def classifier(task: str) -> bool:
    """Whether ``task`` is served as a tensor model of token ids or pixel_values (so
    models.toml's ``kind = "tensor"`` may name a classifier's)."""
    return TASKS[task].finish in (finish_tensor, finish_detection)


def architectures(directory: Path) -> list[str]:
    """The ``architectures`` of the directory's config.json; ValueError saying what is wrong."""
    config = directory / "config.json"
    try:
        doc = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"{str(directory)!r} has no config.json; hf: takes a local Hugging Face model "
            "directory (config, weights, tokenizer files)"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"cannot read {str(config)!r} as JSON: {e}") from None
    found = doc.get("architectures", []) if isinstance(doc, dict) else None
    if not isinstance(found, list) or not all(isinstance(a, str) for a in found):
        raise ValueError(f"{str(config)!r}: expected 'architectures' to list class names")
    return found


def served() -> str:
    """The architectures hf: sources serve, as error messages list them."""
    ends: dict[str, list[str]] = {}
    for end, task in ARCHITECTURES.items():
        ends.setdefault(task, []).append(f"*{end}")
    return "; ".join(f"{', '.join(names)} (kind {task!r})" for task, names in ends.items())


@register
class HFSource(ModelSource):
    path_target = True
    name = "hf"
    syntax = "hf:DIRECTORY"
    tasks = tuple(AUTO_CLASSES)
    refused = MappingProxyType(
        {"weights": "hf: directories carry their own weights; remove 'weights'"}
    )

    def validate(self, table: Table, source: Source) -> None:
        if not source.path(table.base_dir).is_dir():
            table.fail(
                "source",
                f"directory {source.target!r} not found{table.relative(source.target)}; hf: "
                "takes a local Hugging Face model directory (config, weights, tokenizer files)",
            )

    def task(self, table: Table, source: Source) -> str:
        """The task the config's architectures give; models.toml's ``kind`` may repeat it."""
        directory = source.path(table.base_dir)
        try:
            names = architectures(directory)
        except ValueError as e:
            table.fail("source", str(e))
        problem = hf_config.config(directory).get("problem_type")
        served_as = (architecture_task(name, problem) for name in names)
        tasks = list(dict.fromkeys(t for t in served_as if t is not None))
        if "kind" in table:
            task = table.choice("kind", tuple(TASKS), "")
            if task == "tensor" and len(tasks) == 1 and classifier(tasks[0]):
                return tasks[0]  # a classifier is a tensor model: its task is its kind
            # a sequence classifier may be served as its architecture says, whatever its
            # problem_type (a multi-label model as a softmax classifier: the user's choice)
            plain = {architecture_task(name) for name in names}
            if task not in self.tasks or (names and task not in tasks and task not in plain):
                what = (
                    f"its architectures {names} are served as {tasks}"
                    if tasks
                    else f"none of its architectures {names} is served"
                )
                table.fail(
                    "kind",
                    f"{task!r} contradicts the directory's config.json: {what}; hf: sources "
                    f"serve {served()}",
                )
            return task
        if len(tasks) == 1:
            return tasks[0]
        if tasks:
            table.fail(
                "source",
                f"the directory's config.json names architectures {names} of the kinds "
                f"{tasks}; choose one with kind = ...",
            )
        found = f"the architectures {names}" if names else "no architectures"
        table.fail(
            "source",
            f"the directory's config.json names {found}; hf: sources serve {served()}",
        )

    def defaults(self, table: Table, source: Source, task: str) -> ModelSpec | None:
        """A classifier's inputs, labels and layers come from the directory."""
        return self._classifier(table, source, task) if classifier(task) else None

    def _classifier(self, table: Table, source: Source, task: str) -> ModelSpec:
        directory = source.path(table.base_dir)
        for key in ("inputs", "labels", "output_shape"):
            if key in table:
                table.fail(key, "a Hugging Face classifier declares its own; remove this")
        try:
            doc = hf_config.config(directory)
            auto = AUTO_CLASSES[task]
            # (a model of image–text pairs serves no layer methods: it names no layers)
            pairs = TASKS[task].family == "image_text"
            embedding, blocks = (None, []) if pairs else hf_config.layer_paths(directory, auto)
        except ImportError:
            table.fail("source", "hf: sources need transformers: pip install 'attrserve[hf]'")
        except Exception as e:  # an architecture transformers does not know, a broken config
            table.fail("source", f"cannot read the directory's config: {' '.join(str(e).split())}")
        images = None
        if pairs or auto in (hf_image.AUTO_CLASS, hf_image.SEGMENTATION_AUTO_CLASS,
                             hf_image.DETECTION_AUTO_CLASS):  # fmt: skip
            try:
                images = hf_image.images(str(directory))
            except ValueError as e:
                table.fail("source", str(e))
        labels = hf_config.labels(doc)
        if TASKS[task].targets == "none":  # a regression: one value, no classes
            labels = ()
        elif TASKS[task].targets == "answer":  # [start, end, span] (model_registry.hf_qa)
            labels = hf_qa.TARGETS
        common: dict[str, Any] = {
            "id": "",
            "version": "",
            "source": "",
            "device": "auto",
            "dtype": "float32",
            "task": task,
            "description": f"{', '.join(doc.get('architectures', []))} from {source.target}",
        }
        if pairs and images is not None:  # an image and a text per example
            return ModelSpec(
                **common,
                inputs=(
                    InputSpec("pixel_values", "float32", (None, *images.shape)),
                    InputSpec("input_ids", "int64", (None, None)),
                ),
                output=OutputSpec(shape=(), labels=()),
                images=str(directory),
            )
        if images is not None:  # pixel_values in, attributions on them
            dense = TASKS[task].targets == "region"  # a class score per pixel
            return ModelSpec(
                **common,
                inputs=(InputSpec("pixel_values", "float32", (None, *images.shape)),),
                output=OutputSpec(
                    shape=(len(labels), *images.shape[1:]) if dense else (len(labels),),
                    labels=labels,
                ),
                layers=tuple(p for p in (embedding, *blocks) if p is not None),
                images=str(directory),
            )
        if embedding is None:
            table.fail("source", "its model names no input embedding to attribute tokens on")
        per_token = auto == hf_text.TOKEN_AUTO_CLASS  # logits per position and label
        return ModelSpec(
            **common,
            inputs=(InputSpec("input_ids", "int64", (None, None)),),
            output=OutputSpec(
                shape=(None, len(labels)) if per_token else (max(1, len(labels)),),
                labels=labels,
            ),
            layers=(embedding, *blocks),
            embedding_layer=embedding,
            texts_batch=True,  # padding marked in the ids and masked by the wrapper
        )

    def preload(self, spec: ModelSpec, source: Source) -> tuple[str, ...]:
        """transformers and the config's architecture module: ~5 s of imports that each worker
        paid on its own (four Hugging Face models on 2 cores: ready 10 s after the others,
        against 1 s forked from a forkserver that imported them)."""
        try:
            model_type = str(hf_config.config(source.path(spec.base_dir)).get("model_type", ""))
        except (OSError, ValueError):
            model_type = ""
        name = model_type.replace("-", "_")
        arch = (f"transformers.models.{name}.modeling_{name}",) if name.isidentifier() else ()
        return ("transformers", *arch)

    def build(self, spec: ModelSpec, source: Source, device: torch.device) -> Built:
        path = source.path(spec.base_dir)
        try:
            import transformers  # the optional extra, and a heavy import: only when used
        except ImportError:
            raise RegistryError(
                "hf: sources need the transformers package: pip install 'attrserve[hf]'",
                model=spec.id,
                field="source",
            ) from None
        auto = getattr(transformers, AUTO_CLASSES[spec.task])
        # a server's log is not a terminal: no progress bars of the weights loading
        transformers.utils.logging.disable_progress_bar()
        try:
            # local_files_only: a directory on disk, never the network
            model = auto.from_pretrained(
                str(path), local_files_only=True, dtype=getattr(torch, spec.dtype)
            )
            tokenizer = None
            if spec.images is None or TASKS[spec.task].family == "image_text":
                tokenizer = transformers.AutoTokenizer.from_pretrained(
                    str(path), local_files_only=True
                )
        except Exception as e:  # OSError, ValueError, KeyError for unknown architectures ...
            flat = " ".join(str(e).split())
            raise RegistryError(
                f"{str(path)!r} is not a loadable Hugging Face {spec.task} directory (config, "
                f"weights and {'image processor' if spec.images else 'tokenizer'} files): {flat}",
                model=spec.id,
                field="source",
            ) from e
        if TASKS[spec.task].family == "image_text":
            return _pairs(spec, model, tokenizer)
        if spec.images is not None:
            if TASKS[spec.task].targets == "box":  # detections, scored per wanted box
                return Built(BoxScore(model, hf=True))
            dense = TASKS[spec.task].targets == "region"
            return Built((hf_image.Segmenter if dense else hf_image.ImageClassifier)(model))
        if classifier(spec.task):
            return _classifier(spec, model, tokenizer)
        return Built(model, tokenizer)


def _classifier(spec: ModelSpec, model: Any, tokenizer: Any) -> Built:
    """The sequence classifier as a tensor model of token ids, with its tokenizer."""
    cfg = model.config
    why = hf_text.real_tokenizer(tokenizer, int(cfg.vocab_size))
    if why is not None:
        raise RegistryError(why, model=spec.id, field="source")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else cfg.pad_token_id
    if pad is None:
        raise RegistryError(
            "the tokenizer and the config name no pad token, which the baselines need",
            model=spec.id,
            field="source",
        )
    types = (
        "token_type_ids" in getattr(tokenizer, "model_input_names", ())
        and int(getattr(cfg, "type_vocab_size", 0) or 0) > 1
    )
    answering = TASKS[spec.task].targets == "answer"
    wrap = hf_qa.QuestionAnswerer if answering else hf_text.TextClassifier
    wrapped = wrap(model, int(pad), tokenizer.sep_token_id, types)
    positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 512
    return Built(wrapped, tokenizer=hf_text.Tokenize(tokenizer, positions, int(pad)))


def _pairs(spec: ModelSpec, model: Any, tokenizer: Any) -> Built:
    """A CLIP model as a model of image–text pairs, with its tokenizer."""
    cfg = model.config.text_config
    why = hf_text.real_tokenizer(tokenizer, int(cfg.vocab_size))
    if why is not None:
        raise RegistryError(why, model=spec.id, field="source")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else cfg.pad_token_id
    pad = int(pad if pad is not None else cfg.eos_token_id)
    positions = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 77
    return Built(hf_clip.ImageTextSimilarity(model, pad),
                 tokenizer=hf_text.Tokenize(tokenizer, positions, pad))  # fmt: skip
