"""What the registry knows about a served model, before and after loading.

This module fixes the interface between ``model_registry`` (which builds specs from
models.toml or the built-in demo registry, and loads them) and ``service`` (which validates
requests against specs and runs the engine on loaded models).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

#: dtypes a model's parameters may be cast to (the "working" dtype of gradient methods)
MODEL_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: dtypes a model input may have
INPUT_DTYPES = (*MODEL_DTYPES, "int8", "int16", "int32", "int64", "uint8", "bool")
#: what ``ModelSpec.device`` may say
DEVICE = re.compile(r"^(auto|cpu|cuda:\d+)$")


def resolve_path(path: str, base_dir: str | None) -> Path:
    """``path`` from a spec's ``source`` or ``weights``: a relative one is taken from
    ``base_dir`` (``ModelSpec.base_dir``, the directory of the models.toml)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else Path(base_dir) / p


@dataclass(frozen=True)
class InputSpec:
    """One model input: its name, dtype and shape (None marks a free dim; dim 0 is the batch)."""

    name: str
    dtype: str  # torch dtype name without the prefix: "float32", "int64", ...
    shape: tuple[int | None, ...]
    #: a row of features ([N, F]): each feature's name, shown by pictures and the explorer
    features: tuple[str, ...] | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)  # validated when the spec is built


@dataclass(frozen=True)
class OutputSpec:
    """The model output per example (without the batch dim) and optional class labels."""

    shape: tuple[int | None, ...]
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExplainSpec:
    """A model's default explanation (KServe ``:explain`` without parameters): a method and
    its params, as an attributions request would give them."""

    method: str
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class ExportedStep:
    """``attribution-export:`` sources: the one attribution the file computes.

    Read from the file's description (``methods.export.save``), or only ``method`` from
    models.toml when the file has none (then ``params`` and ``target`` are unknown: requests
    may give neither)."""

    method: str
    #: the effective params baked in (defaults included); None: unknown
    params: dict[str, Any] | None = field(default=None, hash=False, compare=False)
    #: "input" (one class per example, given at each call) or the baked target (None, an int,
    #: an index list); ``described`` False: unknown
    target: Any = field(default=None, hash=False, compare=False)
    described: bool = True
    #: whether baselines / additional forward args are baked in (requests may not give them)
    baselines: Any = field(default=None, hash=False, compare=False)

    @property
    def per_example_target(self) -> bool:
        return self.described and self.target == "input"


#: torch.compile modes a models.toml may name
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class ModelSpec:
    id: str
    version: str
    description: str
    #: "builtin:NAME", "torchscript:PATH", "export:PATH", "python:pkg.mod:factory", "hf:DIR"
    source: str
    device: str  # "auto" | "cpu" | "cuda:N" as configured
    dtype: str  # working floating dtype of the model's parameters
    inputs: tuple[InputSpec, ...]
    output: OutputSpec
    layers: tuple[str, ...] = ()  # dotted module paths exposed for layer/neuron methods
    embedding_layer: str | None = None  # token models: where gradient methods attach
    weights: str | None = None  # optional weights file for python: sources
    #: per-model overrides of the server's batching defaults
    internal_batch_size: int | str | None = None
    perturbations_per_eval: int | str | None = None
    #: directory that relative paths in ``source``/``weights`` resolve against (the directory of
    #: the models.toml that declared the model; None: the current directory). ``python:``
    #: sources may also import modules that sit there.
    base_dir: str | None = None
    #: models.toml ``explain``; None: the built-in default for the model's task
    explain: ExplainSpec | None = None
    #: models.toml ``defaults``: per method (as requests name it), the params a request of
    #: that method leaves out take these values (e.g. ``n_steps = "auto"``)
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    #: what the model does, as models.toml's ``kind`` names it (a key of
    #: ``model_registry.tasks.TASKS``): "tensor" (tensors in, one tensor out; the Hugging Face
    #: classifiers name their task, served alike), "causal_lm" (a generative language model
    #: with its tokenizer: attributions of an answer to the prompt,
    #: ``methods.attribute_generation``) or "seq2seq_lm" (an encoder-decoder: the same, the
    #: prompt its source); ``tasks.task_of(spec)`` is its record
    task: str = "tensor"
    #: models.toml ``compile``: hook-free methods run on ``torch.compile(model, dynamic=True,
    #: mode=compile_mode)``, warmed up at load (eager on failure, with the reason reported)
    compile: bool = False
    compile_mode: str = "default"
    #: models.toml ``verify_device``: a probe attribution compared at load with a float64 CPU
    #: copy; None: on for devices other than the CPU and for float16/bfloat16 models
    verify_device: bool | None = None
    #: models.toml ``precision``: the default of attribution requests' ``precision`` (None:
    #: the model's dtype; ``methods.engine.precision``)
    precision: str | None = None
    #: models.toml ``fidelity_sample``: the share of low-precision requests checked against
    #: float32 unasked (None: the server's ``ATTRSERVE_VERIFY_SHARE``, default 0.05)
    fidelity_sample: float | None = None
    #: models.toml ``fidelity_tolerance``: the largest relative L2 error from float32 a checked
    #: low-precision answer may have before the float32 answer replaces it
    fidelity_tolerance: float = 0.05
    #: models.toml ``background``: a file of reference rows (``model_registry.background``),
    #: the Shapley-family methods' baselines when a request names none; ``background_kmeans``:
    #: summarised into that many weighted rows
    background: str | None = None
    background_kmeans: int | None = None
    #: ``remote:`` sources: where and how the predictor is called
    #: (``model_registry.sources.remote.RemoteSpec``)
    remote: Any = None
    #: ``attribution-export:`` sources: the attribution the file computes (its only method)
    exported: ExportedStep | None = None
    #: models.toml ``group``: the worker group that serves the model (None: its own, named by
    #: its id); models of one group share its worker processes, and their fate
    group: str | None = None
    #: models.toml ``workers``: worker processes of the model's group (None: the server's
    #: ``ATTRSERVE_WORKERS``)
    workers: int | None = None
    #: texts of different lengths batch together without changing each other's numbers (the
    #: tokenizer marks padding and the model masks it: Hugging Face classifiers), so requests
    #: of texts merge
    texts_batch: bool = False
    #: Hugging Face image classifiers: the directory whose image processor makes images sent
    #: as ``{"image": "<base64>"}`` into the ``pixel_values`` input (``hf_image.images``)
    images: str | None = None
    #: models.toml ``[models.influence]``: the training data and checkpoints of the model's
    #: influence index (``model_registry.influence.InfluenceSpec``); None: not served
    influence: Any = None

    @property
    def takes_text(self) -> bool:
        """Whether requests may send texts, which the loaded model's tokenizer makes ids: token
        models (their embedding layer named) and remote predictors sent text."""
        return self.embedding_layer is not None or getattr(self.remote, "send", "") == "text"

    @property
    def group_name(self) -> str:
        """The worker group serving the model: ``group``, else the model's own id."""
        return self.group or self.id


@dataclass
class LoadedModel:
    """A spec with its model resident on a device (what a worker holds)."""

    spec: ModelSpec
    model: Any  # nn.Module, ScriptModule, or ExportedProgram module: callable(*inputs)
    device: torch.device
    is_torchscript: bool = False
    #: models that take text: text -> (ids LongTensor [N, L], tokens list[list[str]])
    #: texts (or, where it has ``pairs = True``, pairs of texts) -> (ids, tokens per text)
    tokenizer: Callable[[Sequence[Any]], tuple[torch.Tensor, list[list[str]]]] | None = None
    #: causal LMs: the model's own tokenizer object (Hugging Face's interface: encode, decode,
    #: convert_ids_to_tokens, convert_tokens_to_ids), what ``attribute_generation`` takes
    text_tokenizer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
