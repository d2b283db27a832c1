"""Real models, real speed: attrserve against Captum on full-size Hugging Face architectures.

    python -m benchmarks.real [--quick] [--device cpu|cuda] [--threads N] [--only NAME[,NAME]]
                              [--json PATH] [--max-run-s S] [--memory-budget-gib G]

Five models built in code from transformers' default configs, random weights, seeded, nothing
downloaded: a BERT-base sequence classifier, a DistilBERT token classifier, ViT-B/16 at 224 px,
ResNet-50 and GPT-2 small. Each row is one method on one model, side by side in one process:

- Captum in float32 with its defaults: no ``internal_batch_size`` (every row in one pass), one
  perturbation per forward; for GPT-2 its fastest path that runs under transformers 5
  (``use_cached_outputs=False, forward_in_tokens=False``: see ``benchmarks.generation``);
- attrserve in float32 and in bfloat16 (on CUDA float16 too), its batch sizes ``"auto"`` (the
  engine's memory budget, ``--memory-budget-gib``, sizes the chunks; the note gives the most
  evaluations one chunk held). Should Captum's one pass run out of memory (IG family), it is
  rerun with a fixed ``internal_batch_size``, ours too, and the note says so;
- the float32 floor: one plain forward (and backward, for gradient methods) over as many rows
  as the method evaluates, timed with torch alone, parameters frozen.

Low-precision columns give what the precision cost against attrserve's own float32 answer
(relative L2 and top-10 agreement: ``methods.engine.precision.compare``); "vs Captum" is the
float32 answer's relative L2 from Captum's. Memory: the peak RSS growth during a run's first
call on a CPU (Linux's peak RSS, reset before the run, after ``malloc_trim`` hands back what
earlier runs freed; elsewhere sampled every 2 ms, which slowed a 2-core machine's runs by ~7%),
``torch.cuda.max_memory_allocated`` growth on CUDA.

A run whose first call takes under ``REPEAT_UNDER_S`` (full 5 s, quick 2 s) is called three
times more and the median kept; a slower one is timed once (its work dwarfs first-call costs).
A run whose estimate exceeds ``--max-run-s`` (quick 45 s, full 600 s), or under ``--quick``
would end past ``QUICK_TOTAL_S`` after the start (cases run cheapest first, so the tail goes),
is skipped and its cell says why. The floor's estimate scales a plain forward(+backward) of one
evaluation's rows (or four, when one's estimate is over the limit) to all of them; Captum's is
the floor's, or for a perturbation method its forwards of one evaluation each; ours in float32
is the floor's, and a low precision's is our float32 time times the device's measured
slowdown (at least ``EMULATED_BF16`` on a CPU without bfloat16 units).

``--quick``: 32-token texts, 8 steps, one 224 px image, a 16-token prompt with a 4-token answer
(4 steps). Full: 128-token texts (64 on a CPU), 50 steps, 4 images (1 on a CPU: Captum's
one-pass IG over 200 ViT-B rows holds tens of GB), a 30-token prompt with a 10-token answer.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

import methods
from benchmarks.real_tasks import CASES as TASK_CASES
from benchmarks.timing import table
from methods import progress
from methods.engine import precision as precision_

NO_CUDA = "no CUDA device: --device cuda needs a GPU that torch can see"
#: runs faster than this (full, quick) are repeated (median of REPEAT); slower ones are
#: timed once
REPEAT_UNDER_S = {False: 5.0, True: 2.0}
REPEAT = 3
#: --quick skips a run that would end past this many seconds after the start (the whole
#: command: under 5 minutes on a 2-core CPU)
QUICK_TOTAL_S = 240.0
#: bfloat16's time over float32's assumed on a CPU without bfloat16 units, where the probe
#: reads less: measured here 5x (BERT-base feature ablation) to 85x (DistilBERT layer IG)
EMULATED_BF16 = 60.0
TARGET = 1  # the class attributed (every classifier here has two labels)
TINY = {False: "", True: " (tiny config)"}


@dataclass(frozen=True)
class Sizes:
    text_tokens: int
    steps: int
    images: int
    prompt_tokens: int
    answer_tokens: int
    llm_steps: int
    tiny: bool = False


def sizes(quick: bool, device: torch.device, tiny: bool = False) -> Sizes:
    if tiny:  # the test's: every model shrunk to a few thousand parameters
        return Sizes(12, 4, 1, 8, 3, 4, tiny=True)
    if quick:
        return Sizes(32, 8, 1, 16, 4, 4)
    cuda = device.type == "cuda"
    return Sizes(128 if cuda else 64, 50, 4 if cuda else 1, 30, 10, 50)


# -- one row: what runs, and what it measured ----------------------------------------------------


Runs = tuple[Callable[[str], Any], Callable[[], Any]]


@dataclass
class Row:
    """One method on one model. ``ours(precision)`` and ``captum()`` return the attributions;
    ``floor(k)`` is a plain forward(+backward) over k of the rows the method evaluates."""

    key: str
    case: str
    method: str
    ours: Callable[[str], Any]
    captum: Callable[[], Any]
    floor: Callable[[int], Callable[[], None]]
    rows: int  # rows the method evaluates
    unit: int  # rows of one evaluation (the examples)
    captum_forwards: int | None = None  # perturbation methods: Captum's forwards, one by one
    twin_of: nn.Module | None = None  # the model whose low-precision copy ours runs
    note: str = ""
    #: IG family: (ours, captum) both at a fixed internal_batch_size, for when Captum's
    #: one pass over every row runs out of memory
    fixed: Callable[[int], Runs] | None = None


@dataclass
class Measured:
    key: str
    case: str
    method: str
    captum_s: float | None = None
    #: by precision: our seconds, and peak memory (MiB); "captum" too in memory
    ours_s: dict[str, float | None] = field(default_factory=dict)
    memory_mib: dict[str, float | None] = field(default_factory=dict)
    floor_s: float | None = None
    floor_estimated: bool = False
    #: by low precision: (relative L2, top-k agreement, k) against our float32 answer
    fidelity: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    vs_captum_rel_l2: float | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


# -- timing and memory ---------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trim() -> None:
    """Hand the C allocator's freed memory back to the OS, so that the next run's RSS growth
    is its own rather than hidden in what an earlier, bigger run left (glibc only)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak_rss() -> bool:
    """Reset Linux's peak RSS of this process (VmHWM) to its current RSS: the exact peak of
    the next run with no sampling thread, which on 2 cores slowed ViT-B/16 IG's first call by
    7% (a thread waking every 2 ms preempts one of the two compute threads)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _rss_kib("VmHWM") > 0
    except (OSError, ValueError):
        return False


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise ValueError(f"no {field} in /proc/self/status")


@contextlib.contextmanager
def peak_mib(device: torch.device) -> Iterator[list[float | None]]:
    """Yields a one-item list that holds the block's peak memory growth (MiB) on exit."""
    out: list[float | None] = [None]
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        yield out
        sync(device)
        out[0] = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        return
    try:
        import psutil
    except ImportError:  # the process's lifetime peak only moves on a new record
        import resource

        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        yield out
        out[0] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        return
    _trim()
    if _reset_peak_rss():
        start = _rss_kib("VmRSS")
        yield out
        out[0] = (_rss_kib("VmHWM") - start) / 1024
        return
    proc = psutil.Process()
    start = proc.memory_info().rss
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.002):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield out
    finally:
        done.set()
        sampler.join()
        peak[0] = max(peak[0], proc.memory_info().rss)
        out[0] = (peak[0] - start) / 2**20


def timed(
    fn: Callable[[], Any], device: torch.device, repeat_under: float
) -> tuple[float, Any, float | None]:
    """Seconds of ``fn`` (the median of REPEAT more runs when the first took under
    ``repeat_under`` seconds, else the first), its answer, and the first run's peak memory
    growth (MiB)."""
    with peak_mib(device) as mem:
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        first = time.perf_counter() - t0
    if first >= repeat_under:
        return first, out, mem[0]
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out, mem[0]


class _Chunks:
    """Stands in for the progress bar (``methods.progress``), which every engine loop tells how
    many evaluations each chunk ran: the benchmark's one window on what "auto" chose."""

    def __init__(self) -> None:
        self.total = self.n = 0  # what the bar counts (methods.progress.mark reads them)
        self.sizes: list[int] = []

    def refresh(self) -> None:
        pass

    def update(self, n: int) -> None:
        self.n += n
        self.sizes.append(n)


@contextlib.contextmanager
def chunks_seen() -> Iterator[_Chunks]:
    seen = _Chunks()
    token = progress._bar.set(seen)
    try:
        yield seen
    finally:
        progress._bar.reset(token)


def low_precision_slowdown(device: torch.device, names: list[str]) -> dict[str, float]:
    """How many times longer a transformer MLP block (256 rows of BERT-base's widths) and a
    ResNet conv layer take, forward and backward, in each low precision than in float32 on
    ``device``: the low-precision estimates' factor. Smaller shapes understate an emulated
    bfloat16's cost: float32 is not at full speed on them (here: 9x at 64 rows, 23x at 256,
    ~40x on BERT-base)."""
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(768, 3072), nn.GELU(), nn.Linear(3072, 768)).to(device)
    conv = nn.Conv2d(64, 64, 3, padding=1).to(device)
    xs = (torch.randn(256, 768, device=device), torch.randn(1, 64, 56, 56, device=device))

    def seconds(dtype: torch.dtype) -> float:
        total = 0.0
        for m, x in zip((mlp.to(dtype), conv.to(dtype)), xs, strict=True):
            leaf = x.detach().to(dtype).requires_grad_(True)
            best = math.inf
            for _ in range(4):  # the best of warm calls, while they are quick (emulated: ~3 s)
                t0 = time.perf_counter()
                torch.autograd.grad(m(leaf).float().sum(), leaf)
                sync(device)
                best = min(best, time.perf_counter() - t0)
                if best > 0.5:
                    break
            total += best
        return total

    f32 = seconds(torch.float32)
    return {p: seconds(precision_.DTYPES[p]) / f32 for p in names}


# -- the models ----------------------------------------------------------------------------------


class Logits(nn.Module):
    """A Hugging Face model as a function of one input, returning its logits (at one position
    for a token classifier)."""

    def __init__(self, model: nn.Module, key: str, position: int | None = None) -> None:
        super().__init__()
        self.model, self.key, self.position = model, key, position

    def forward(self, x: Tensor) -> Tensor:
        logits: Tensor = self.model(**{self.key: x}).logits
        return logits if self.position is None else logits[:, self.position]


@contextlib.contextmanager
def frozen(model: nn.Module) -> Iterator[None]:
    before = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, r in zip(model.parameters(), before, strict=True):
            p.requires_grad_(r)


def plain(
    fn: Callable[[Tensor], Tensor],
    model: nn.Module,
    example: Tensor,
    grad: bool,
    layer: nn.Module | None = None,
) -> Callable[[int], Callable[[], None]]:
    """The floor: ``fn`` (rows -> one score per row) over ``example`` repeated to k rows; with
    ``grad``, the backward to the input (or to ``layer``'s output)."""

    def make(k: int) -> Callable[[], None]:
        reps = math.ceil(k / example.shape[0])
        rows = example.repeat(reps, *([1] * (example.dim() - 1)))[:k]

        def run() -> None:
            with frozen(model):
                if not grad:
                    with torch.no_grad():
                        fn(rows)
                    return
                if layer is None:
                    leaf = rows.detach().requires_grad_(True)
                    torch.autograd.grad(fn(leaf).sum(), leaf)
                    return
                seen: list[Tensor] = []

                def tap(_m: nn.Module, _i: Any, out: Tensor) -> Tensor:
                    seen.append(out.detach().requires_grad_(True))
                    return seen[-1]

                handle = layer.register_forward_hook(tap)
                try:
                    score = fn(rows).sum()
                finally:
                    handle.remove()
                torch.autograd.grad(score, seen[0])

        return run

    return make


def attributions(value: Any) -> Any:
    """The attribution tensors of an answer: ours, Captum's, or a generation result's."""
    if isinstance(value, methods.Result):
        return value.attributions
    if hasattr(value, "token_attr") and value.token_attr is not None:
        return value.token_attr
    return value


def ours_fn(model: nn.Module, x: Tensor, method: str, **kw: Any) -> Callable[[str], Any]:
    def run(prec: str) -> Any:
        return methods.attribute(model, x, method, target=TARGET, precision=prec, **kw)

    return run


def ig_family(
    model: nn.Module, x: Tensor, method: str, captum: Any, layer: str | None = None, **kw: Any
) -> Callable[[int | None], Runs]:
    """Ours (``method``, on ``layer`` if given) and Captum's ``captum.attribute`` with the same
    arguments, at an internal_batch_size (None: ours "auto", Captum's unset)."""
    on = {"layer": layer} if layer else {}

    def at(batch: int | None) -> Runs:
        ours = ours_fn(model, x, method, internal_batch_size=batch or "auto", **on, **kw)
        return ours, lambda: captum.attribute(x, target=TARGET, internal_batch_size=batch, **kw)

    return at


def words_mask(n_tokens: int, g: torch.Generator) -> tuple[Tensor, int]:
    """[CLS], words of 1 to 3 word pieces, [SEP]: a feature id per token, and how many."""
    ids, word, left = [0], 0, n_tokens - 2
    while left > 0:
        word += 1
        size = min(left, int(torch.randint(1, 4, (), generator=g)))
        ids += [word] * size
        left -= size
    ids.append(word + 1)
    return torch.tensor([ids]), word + 2


def text_ids(vocab: int, n_tokens: int, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Token ids [n, L] ([CLS] ... [SEP], BERT's ids 101 and 102) and their baselines ([PAD]
    between the two)."""
    cls_, sep = (101, 102) if vocab > 1000 else (1, 2)
    body = torch.randint(max(3, vocab // 30), vocab, (n, n_tokens - 2), generator=g)
    ids = torch.cat([torch.full((n, 1), cls_), body, torch.full((n, 1), sep)], dim=1)
    base = ids.clone()
    base[:, 1:-1] = 0
    return ids, base


def bert_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import FeatureAblation, LayerIntegratedGradients
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig()  # BERT-base; num_labels is 2 by default
    if s.tiny:
        cfg = BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32)  # fmt: skip
    hf = BertForSequenceClassification(cfg).eval().to(device)
    model = Logits(hf, "input_ids")
    g = torch.Generator().manual_seed(0)
    ids, base = (t.to(device) for t in text_ids(cfg.vocab_size, s.text_tokens, 1, g))
    mask, n_words = words_mask(s.text_tokens, g)
    mask = mask.to(device)
    layer = hf.bert.embeddings
    label = f"BERT-base seq-cls, {s.text_tokens} tokens{TINY[s.tiny]}"
    score = lambda x: model(x)[:, TARGET]  # noqa: E731
    lig = ig_family(model, ids, "layer_integrated_gradients",
                    LayerIntegratedGradients(model, layer), "model.bert.embeddings",
                    baselines=base, n_steps=s.steps)  # fmt: skip
    fa = FeatureAblation(model)
    return [
        Row(
            "bert/layer_ig", label, f"layer IG n={s.steps} (bert.embeddings)", *lig(None),
            plain(score, model, ids, grad=True, layer=layer), s.steps, 1, twin_of=model,
            fixed=lig,
        ),
        Row(
            "bert/feature_ablation", label, f"feature ablation, {n_words} words",
            ours_fn(model, ids, "feature_ablation", baselines=0, feature_mask=mask,
                    perturbations_per_eval="auto"),
            lambda: fa.attribute(ids, baselines=0, feature_mask=mask, target=TARGET),
            plain(score, model, ids, grad=False), n_words + 1, 1, captum_forwards=n_words + 1,
            twin_of=model,
        ),
    ]  # fmt: skip


def distilbert_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import LayerIntegratedGradients
    from transformers import DistilBertConfig, DistilBertForTokenClassification

    torch.manual_seed(0)
    cfg = DistilBertConfig()
    if s.tiny:
        cfg = DistilBertConfig(vocab_size=100, dim=16, n_layers=1, n_heads=2, hidden_dim=32)
    position = s.text_tokens // 2
    hf = DistilBertForTokenClassification(cfg).eval().to(device)
    model = Logits(hf, "input_ids", position)
    g = torch.Generator().manual_seed(1)
    ids, base = (t.to(device) for t in text_ids(cfg.vocab_size, s.text_tokens, 1, g))
    layer = hf.distilbert.embeddings
    lig = ig_family(model, ids, "layer_integrated_gradients",
                    LayerIntegratedGradients(model, layer), "model.distilbert.embeddings",
                    baselines=base, n_steps=s.steps)  # fmt: skip
    return [
        Row(
            "distilbert/layer_ig", f"DistilBERT token-cls, {s.text_tokens} tokens{TINY[s.tiny]}",
            f"layer IG n={s.steps} (embeddings), token {position}", *lig(None),
            plain(lambda x: model(x)[:, TARGET], model, ids, grad=True, layer=layer),
            s.steps, 1, twin_of=model, fixed=lig,
        ),
    ]  # fmt: skip


def image_rows(
    s: Sizes, device: torch.device, name: str, label: str, model: nn.Module, size: int
) -> tuple[list[Row], Tensor]:
    """IG and occlusion (16x16 windows, stride 16) on ``model``'s pixel_values."""
    from captum.attr import IntegratedGradients, Occlusion

    g = torch.Generator().manual_seed(2)
    x = torch.randn(s.images, 3, size, size, generator=g).to(device)
    n = s.images
    windows = (size // 16) ** 2
    score = lambda v: model(v)[:, TARGET]  # noqa: E731
    ig = ig_family(model, x, "integrated_gradients", IntegratedGradients(model), n_steps=s.steps)
    occ = Occlusion(model)
    box = {"sliding_window_shapes": (3, 16, 16), "strides": (3, 16, 16)}
    return [
        Row(
            f"{name}/integrated_gradients", label, f"IG n={s.steps}", *ig(None),
            plain(score, model, x, grad=True), s.steps * n, n, twin_of=model, fixed=ig,
        ),
        Row(
            f"{name}/occlusion", label, f"occlusion 16x16 stride 16 ({windows} windows)",
            ours_fn(model, x, "occlusion", perturbations_per_eval="auto", **box),
            lambda: occ.attribute(x, target=TARGET, **box),
            plain(score, model, x, grad=False), (windows + 1) * n, n,
            captum_forwards=windows + 1, twin_of=model,
        ),
    ], x  # fmt: skip


def vit_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import Saliency
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig()
    if s.tiny:
        cfg = ViTConfig(image_size=32, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32)  # fmt: skip
    model = Logits(ViTForImageClassification(cfg).eval().to(device), "pixel_values")
    size = 32 if s.tiny else 224
    label = f"ViT-B/16 {size}px, {s.images} image(s){TINY[s.tiny]}"
    rows, x = image_rows(s, device, "vit", label, model, size)
    sal = Saliency(model)
    rows.insert(1, Row(
        "vit/saliency", label, "saliency",
        ours_fn(model, x, "saliency"),
        lambda: sal.attribute(x, target=TARGET),
        plain(lambda v: model(v)[:, TARGET], model, x, grad=True), s.images, s.images,
        twin_of=model,
    ))  # fmt: skip
    return rows


def resnet_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import LayerGradCam
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(0)
    cfg = ResNetConfig()  # ResNet-50
    size = 224
    if s.tiny:
        cfg = ResNetConfig(embedding_size=8, hidden_sizes=[8, 8, 8, 8], depths=[1, 1, 1, 1],
                           layer_type="basic")  # fmt: skip
        size = 32
    hf = ResNetForImageClassification(cfg).eval().to(device)
    model = Logits(hf, "pixel_values")
    label = f"ResNet-50 {size}px, {s.images} image(s){TINY[s.tiny]}"
    rows, x = image_rows(s, device, "resnet", label, model, size)
    stage = hf.resnet.encoder.stages[-1]
    path = f"model.resnet.encoder.stages.{len(hf.resnet.encoder.stages) - 1}"
    cam = LayerGradCam(model, stage)
    rows.insert(1, Row(
        "resnet/layer_gradcam", label, "Grad-CAM (last stage)",
        ours_fn(model, x, "layer_gradcam", layer=path),
        lambda: cam.attribute(x, target=TARGET),
        plain(lambda v: model(v)[:, TARGET], model, x, grad=True, layer=stage),
        s.images, s.images, twin_of=model,
    ))  # fmt: skip
    return rows


def gpt2_rows(s: Sizes, device: torch.device) -> list[Row]:
    from captum.attr import (
        FeatureAblation,
        LayerIntegratedGradients,
        LLMAttribution,
        LLMGradientAttribution,
        TextTokenInput,
    )
    from transformers import GPT2Config, GPT2LMHeadModel

    from benchmarks.generation import tokenizer

    words = ["<unk>", "<bos>", "<eos>", *(f"w{i}" for i in range(1000))]
    tok = tokenizer(words)
    torch.manual_seed(0)
    cfg = GPT2Config(bos_token_id=1, eos_token_id=2)
    if s.tiny:
        cfg = GPT2Config(vocab_size=len(words), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                         bos_token_id=1, eos_token_id=2)  # fmt: skip
    model = GPT2LMHeadModel(cfg).eval().to(device)
    g = torch.Generator().manual_seed(3)
    pick = lambda k: " ".join(f"w{int(i)}" for i in torch.randint(1000, (k,), generator=g))  # noqa: E731
    prompt, answer = pick(s.prompt_tokens - 1), pick(s.answer_tokens)  # + <bos>
    n_feat = s.prompt_tokens - 1
    ids = torch.tensor([tok.encode(f"{prompt} {answer}")], device=device)
    t = s.answer_tokens

    def score(v: Tensor) -> Tensor:
        return model(v).logits[:, -t - 1 : -1].log_softmax(-1)[..., 0].sum(-1)

    def ours(method: str, **kw: Any) -> Callable[[str], Any]:
        def run(prec: str) -> Any:
            return methods.attribute_generation(
                model, tok, prompt, method, target=answer, baselines="<unk>",
                skip_tokens=["<bos>"], precision=prec, **kw,
            )  # fmt: skip

        return run

    def lig_at(batch: int | None) -> Runs:
        return ours("layer_integrated_gradients", n_steps=s.llm_steps,
                    internal_batch_size=batch or "auto"), lambda: lig.attribute(
            inp, target=answer, n_steps=s.llm_steps, internal_batch_size=batch
        )  # fmt: skip

    inp = TextTokenInput(prompt, tok, baselines="<unk>", skip_tokens=["<bos>"])
    fa = LLMAttribution(FeatureAblation(model), tok)
    lig = LLMGradientAttribution(LayerIntegratedGradients(model, model.transformer.wte), tok)
    label = f"GPT-2 small, {s.prompt_tokens}-token prompt, {t}-token answer{TINY[s.tiny]}"
    return [
        Row(
            "gpt2/feature_ablation", label, f"feature ablation, {n_feat} tokens",
            ours("feature_ablation"),
            lambda: fa.attribute(inp, target=answer, use_cached_outputs=False,
                                 forward_in_tokens=False),
            plain(score, model, ids, grad=False), n_feat + 1, 1, captum_forwards=n_feat + 1,
            twin_of=model,
        ),
        Row(
            "gpt2/layer_ig", label, f"layer IG n={s.llm_steps} (wte), {t} answer tokens",
            *lig_at(None), plain(score, model, ids, grad=True, layer=model.transformer.wte),
            s.llm_steps * t, 1, twin_of=model, fixed=lig_at,
        ),
    ]  # fmt: skip


#: case name -> its rows (built when the case runs: one full-size model in memory at a time)
CASES: dict[str, Callable[[Sizes, torch.device], list[Row]]] = {
    "bert": bert_rows,
    "distilbert": distilbert_rows,
    "gpt2": gpt2_rows,
    "resnet": resnet_rows,
    "vit": vit_rows,  # the slowest last: --quick's total drops the tail first
    # the tasks beside classifiers (CONTRACT 9.4), against their tutorials' wrappers
    **TASK_CASES,
}


# -- running a row -------------------------------------------------------------------------------


def _seconds(fn: Callable[[], Any], device: torch.device) -> float:
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def chunked(
    floor: Callable[[int], Callable[[], None]], rows: int, chunk: int
) -> Callable[[], None]:
    """The floor over ``rows`` rows in chunks of at most ``chunk``."""
    parts = [floor(min(chunk, rows - start)) for start in range(0, rows, chunk)]

    def run() -> None:
        for part in parts:
            part()

    return run


@dataclass(frozen=True)
class Limits:
    """When a run is skipped: estimated over ``run_s``, or ending past ``deadline`` (a
    ``time.perf_counter()`` value: --quick's total)."""

    run_s: float
    deadline: float | None
    why: str  # the cell's reason: "quick" or "--max-run-s S"

    def over(self, est: float) -> str | None:
        if est > self.run_s:
            return f"skipped ({self.why}): est. {est:.0f} s"
        if self.deadline is not None and time.perf_counter() + est > self.deadline:
            return f"skipped ({self.why}): est. {est:.0f} s, past the {QUICK_TOTAL_S:.0f} s total"
        return None


def measure(
    row: Row, device: torch.device, lows: list[str], slowdown: dict[str, float], limits: Limits,
    repeat_under: float,
) -> Measured:  # fmt: skip
    """Every column of one row: the floor, Captum, ours in each precision, the fidelities."""
    m = Measured(row.key, row.case, row.method)
    if row.note:
        m.notes.append(row.note)

    def skip(what: str, est: float) -> bool:
        why = limits.over(est)
        if why is not None:
            m.skipped[what] = why
        return why is not None

    # Estimates: a forward(+backward) of one evaluation's rows (Captum's perturbation forwards
    # are these; the model's first call, so on the high side) scaled to every row; when that is
    # over the limit, of four evaluations' rows (one alone overstates a batch's cost on a CPU:
    # 9x on GPT-2 here).
    unit = min(row.rows, row.unit)
    one = _seconds(row.floor(unit), device)
    est_floor = one * row.rows / unit
    k = min(row.rows, 4 * unit)
    if limits.over(est_floor) and k > unit:
        est_floor = _seconds(row.floor(k), device) * row.rows / k
    if skip("floor", est_floor):
        m.floor_s, m.floor_estimated = est_floor, True
    else:
        chunk = row.rows
        while m.floor_s is None:
            try:
                m.floor_s, _, _ = timed(chunked(row.floor, row.rows, chunk), device, repeat_under)
            except torch.OutOfMemoryError:
                _release(device)
                if chunk == 1:
                    raise
                chunk = max(1, chunk // 2)
        if chunk < row.rows:
            m.notes.append(f"floor in chunks of {chunk} rows (all at once ran out of memory)")

    est_captum = one * row.captum_forwards if row.captum_forwards else est_floor
    captum_answer = None
    ours, captum = row.ours, row.captum
    batch = None
    while not skip("captum", est_captum) and m.captum_s is None:
        try:
            m.captum_s, captum_answer, m.memory_mib["captum"] = timed(captum, device, repeat_under)
        except torch.OutOfMemoryError:
            _release(device)
            batch = row.rows // 2 if batch is None else batch // 2
            if row.fixed is None or batch < 1:
                m.skipped["captum"] = "out of memory"
                ours, batch = row.ours, None
                break
            ours, captum = row.fixed(batch)
    if batch is not None:
        m.notes.append(f"Captum ran out of memory with internal_batch_size unset: both at {batch}")

    if skip("float32", m.floor_s):
        return m
    with chunks_seen() as seen:
        f32, ref, mem = timed(partial(ours, "float32"), device, repeat_under)
    m.memory_mib["float32"] = mem
    m.ours_s["float32"] = f32
    if seen.sizes:
        m.notes.append(f"ours: chunks of up to {max(seen.sizes)} evaluations")
    if captum_answer is not None:
        m.vs_captum_rel_l2 = precision_.compare(attributions(ref), attributions(captum_answer))[0]
    for p in lows:
        if skip(p, f32 * slowdown[p]):
            continue
        if row.twin_of is not None:
            precision_.twin(row.twin_of, precision_.DTYPES[p])  # the copy, made before timing
        try:
            m.ours_s[p], low, m.memory_mib[p] = timed(partial(ours, p), device, repeat_under)
        except (RuntimeError, NotImplementedError) as exc:  # an op without a kernel in p
            m.skipped[p] = f"failed: {str(exc).splitlines()[0][:80]}"
            continue
        m.fidelity[p] = precision_.compare(attributions(low), attributions(ref))
    return m


# -- the table -----------------------------------------------------------------------------------


def headers(lows: list[str], device: torch.device) -> list[str]:
    mem = "peak MiB" if device.type == "cuda" else "RSS Δ MiB"
    cols = ["case", "method", "Captum f32 s", "ours f32 s", "ours/Captum"]
    for p in lows:
        cols += [f"ours {p} s", f"{p}/Captum"]
    cols += ["floor f32 s", "ours/floor", f"Captum {mem}", f"ours f32 {mem}"]
    for p in lows:
        cols += [f"{p} {mem}", f"{p} rel L2", f"{p} top-10"]
    return [*cols, "ours vs Captum rel L2", "note"]


def cells(m: Measured, lows: list[str]) -> list[Any]:
    def sec(v: float | None, what: str) -> Any:
        return m.skipped.get(what, "-") if v is None else v

    def ratio(a: float | None, b: float | None) -> Any:
        return "-" if a is None or b is None or b == 0 else a / b

    def mem(key: str) -> Any:
        v = m.memory_mib.get(key)
        return "-" if v is None else round(v)

    f32 = m.ours_s.get("float32")
    out: list[Any] = [m.case, m.method, sec(m.captum_s, "captum"), sec(f32, "float32"),
                      ratio(f32, m.captum_s)]  # fmt: skip
    for p in lows:
        out += [sec(m.ours_s.get(p), p), ratio(m.ours_s.get(p), m.captum_s)]
    floor: Any = m.floor_s
    if m.floor_estimated and m.floor_s is not None:
        floor = f"~{m.floor_s:.0f} (est.)"
    out += [floor, ratio(f32, m.floor_s), mem("captum"), mem("float32")]
    for p in lows:
        fid = m.fidelity.get(p)
        out += [mem(p), fid[0] if fid else "-", f"{fid[1]:.2f}" if fid else "-"]
    vs = "-" if m.vs_captum_rel_l2 is None else m.vs_captum_rel_l2
    return [*out, vs, "; ".join(m.notes)]


# -- the command ---------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.real",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="short texts, 8 steps, one image")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--only", default=None, help=f"cases or rows, comma-separated: {list(CASES)}, "
                   "or a row's key such as vit/occlusion")  # fmt: skip
    p.add_argument("--json", default=None, metavar="PATH", help="write the rows as JSON")
    p.add_argument(
        "--max-run-s",
        type=float,
        default=None,
        help="skip a run estimated longer than this (default: quick 45, full 600)",
    )
    p.add_argument("--memory-budget-gib", type=float, default=None,
                   help="the engine's memory budget for 'auto' batch sizes (default: the "
                   "engine's: 1 GiB on the CPU, half a GPU's free memory)")  # fmt: skip
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the tests' configs
    return p.parse_args(argv)


def selected(only: str | None) -> tuple[list[str], Callable[[str], bool]]:
    """The cases ``--only`` names (a case, or a row's key), and whether it picks a row."""
    names = {n.strip() for n in (only or "").split(",") if n.strip()}
    unknown = sorted(n for n in names if n.split("/")[0] not in CASES)
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    cases = [c for c in CASES if not names or any(n.split("/")[0] == c for n in names)]
    return cases, lambda key: not names or key in names or key.split("/")[0] in names


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA, file=sys.stderr)
        return 2
    import captum

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_budget_gib:
        methods.set_memory_budget(int(args.memory_budget_gib * 2**30))
    s = sizes(args.quick, device, args.tiny)
    max_s = args.max_run_s if args.max_run_s is not None else (45.0 if args.quick else 600.0)
    why = "quick" if args.quick and args.max_run_s is None else f"--max-run-s {max_s:g}"
    lows = ["bfloat16", "float16"] if device.type == "cuda" else ["bfloat16"]
    cases, picked = selected(args.only)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    start = time.perf_counter()
    deadline = start + QUICK_TOTAL_S if args.quick and not s.tiny else None
    limits = Limits(max_s, deadline, why)
    # the tiny configs (tests) run everything once: no medians, no estimate to scale
    repeat_under = 0.0 if s.tiny else REPEAT_UNDER_S[args.quick]
    probe = {p: 1.0 for p in lows} if s.tiny else low_precision_slowdown(device, lows)
    slowdown = dict(probe)
    emulated = device.type == "cpu" and not s.tiny and not precision_.cpu_has_bfloat16()
    if emulated:
        slowdown = {p: max(v, EMULATED_BF16) for p, v in probe.items()}
    say(f"device {device}, {torch.get_num_threads()} threads; low precision x float32's time: "
        + ", ".join(f"{p} {v:.1f}x" for p, v in slowdown.items()))  # fmt: skip
    results: list[Measured] = []
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore")  # the libraries' deprecation notes, not ours to fix
        for case in cases:
            for row in CASES[case](s, device):
                if picked(row.key):
                    say(f"{row.key} ...")
                    results.append(measure(row, device, lows, slowdown, limits, repeat_under))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    took = time.perf_counter() - start
    mode = "quick" if args.quick else "full"
    print(f"\n## Real models ({mode}, {device}, {torch.get_num_threads()} threads; Captum "
          f"{captum.__version__}, torch {torch.__version__})\n")  # fmt: skip
    print(table(headers(lows, device), [cells(m, lows) for m in results]))
    print("\nLow precision on this device (MLP block + conv, fwd+bwd): "
          + ", ".join(f"{p} {v:.1f}x float32's time" for p, v in probe.items())
          + (f" (no bfloat16 units: estimates assume {EMULATED_BF16:.0f}x)" if emulated else "")
          + f". {took:.0f} s in all.")  # fmt: skip
    if args.json:
        meta = {"device": str(device), "mode": mode, "threads": torch.get_num_threads(),
                "captum": captum.__version__, "torch": torch.__version__,
                "max_run_s": max_s, "slowdown": probe, "seconds": took}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(m) for m in results]}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
