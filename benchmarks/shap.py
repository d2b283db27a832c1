"""attrserve's Shapley family side by side with shap 0.51.0, in one process, at equal values:
``python -m benchmarks.shap`` (``--quick``: smaller cases, one run each, first calls
included: shap's numba code compiles on its first call).

Each row runs the same model (float32, one torch thread unless ``--threads``) through shap
(its explainer on a numpy function, as shap users call a torch model) and through
``methods.attribute``, checks the answers agree, and gives the times and their ratio:

- Exact: ``shapley_values`` over a background set against ``ExactExplainer`` with an
  ``Independent`` masker;
- Kernel: ``kernel_shap`` enumerating every coalition against ``KernelExplainer`` given as many
  samples (both then exact, so the values are comparable);
- Partition: tabular (``"correlation"`` over the background), text (a random BERT built from a
  config, texts of 64 tokens, shap's ``Text`` masker), tabular again with many examples and a
  10-row background summary, and image (a CNN, 64 px, ``blur(16,16)``);
  ``--real``: BERT-base at 64 tokens and ResNet-50 at 224 px (random weights from their
  configs), ``max_evals`` 100.

The forward floor: the model rows the answer needs (coalitions x background rows x
examples) forwarded in chunks of ``FLOOR_CHUNK`` rows; "x forward floor" is the engine's time
over it.
"""

from __future__ import annotations

import argparse
import functools
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import methods
from benchmarks.timing import table
from methods.engine.hierarchy import axis_tree


def _timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    out, best = None, float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3, out


def _numpy(model: torch.nn.Module, shape: tuple[int, ...] | None = None, ids: bool = False) -> Any:
    def f(a: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.asarray(a), dtype=torch.long if ids else torch.float32)
        if shape is not None:
            t = t.reshape(-1, *shape).permute(0, 3, 1, 2)
        with torch.no_grad():
            return model(t).numpy()

    return f


def _mlp(f: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(f, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 3),
    ).eval()  # fmt: skip


#: rows per forward of the floor (one giant batch runs slower than chunks of it)
FLOOR_CHUNK = 4096


def _floor(model: torch.nn.Module, x: torch.Tensor, rows: int, repeat: int) -> float:
    """The model's forward over ``rows`` rows like ``x``'s, in chunks of ``FLOOR_CHUNK``."""
    batch = x[:1].expand(min(rows, FLOOR_CHUNK), *x.shape[1:]).contiguous()

    def run() -> Any:
        with torch.no_grad():
            for start in range(0, rows, FLOOR_CHUNK):
                model(batch[: min(FLOOR_CHUNK, rows - start)])

    return _timed(run, repeat)[0]


def exact(quick: bool, repeat: int) -> list[Any]:
    import shap

    f, n, b = (8, 4, 20) if quick else (10, 10, 50)
    model, g = _mlp(f), torch.Generator().manual_seed(1)
    x, bg = torch.randn(n, f, generator=g), torch.randn(b, f, generator=g)
    explainer = shap.ExactExplainer(_numpy(model), shap.maskers.Independent(bg.numpy(), b))
    t_shap, theirs = _timed(lambda: explainer(x.numpy()).values[..., 0], repeat)
    t_ours, ours = _timed(
        lambda: methods.attribute(model, x, "shapley_values", target=0,
                                  baselines=methods.Background(bg)).attributions,
        repeat,
    )  # fmt: skip
    diff = float(np.abs(ours.numpy() - theirs).max())
    floor = _floor(model, x, n * b * 2**f, repeat)
    name = f"Exact (MLP, {f} features, {n} examples, {b} background rows)"
    return [name, t_shap, t_ours, t_shap / t_ours, t_ours / floor, diff]


def kernel(quick: bool, repeat: int) -> list[Any]:
    import shap

    f, n, b = (8, 4, 10) if quick else (10, 10, 20)
    model, g = _mlp(f), torch.Generator().manual_seed(2)
    x, bg = torch.randn(n, f, generator=g), torch.randn(b, f, generator=g)
    explainer = shap.KernelExplainer(lambda a: _numpy(model)(a)[:, 0], bg.numpy())
    t_shap, theirs = _timed(
        lambda: explainer.shap_values(x.numpy(), nsamples=2**f, silent=True), repeat
    )
    t_ours, ours = _timed(
        lambda: methods.attribute(model, x, "kernel_shap", target=0, n_samples=2**f,
                                  baselines=methods.Background(bg)).attributions,
        repeat,
    )  # fmt: skip
    diff = float(np.abs(ours.numpy() - np.asarray(theirs)).max())
    floor = _floor(model, x, n * b * 2**f, repeat)
    name = f"Kernel (MLP, {f} features, {n} examples, {b} background rows, every coalition)"
    return [name, t_shap, t_ours, t_shap / t_ours, t_ours / floor, diff]


def partition_tabular(quick: bool, repeat: int, many: bool = False) -> list[Any]:
    import shap

    f, n, b = (16, 4, 20) if quick else (32, 10, 50)
    if many:  # many examples, a small summary of the background: shap's per-call cost shows
        f, n, b = (16, 50, 5) if quick else (32, 200, 10)
    model, g = _mlp(f), torch.Generator().manual_seed(3)
    x, bg = torch.randn(n, f, generator=g), torch.randn(b, f, generator=g)
    masker = shap.maskers.Partition(bg.numpy(), clustering="correlation")
    explainer = shap.PartitionExplainer(_numpy(model), masker)
    t_shap, theirs = _timed(
        lambda: explainer(x.numpy(), max_evals=500, outputs=[0], silent=True).values[..., 0],
        repeat,
    )
    t_ours, ours = _timed(
        lambda: methods.attribute(model, x, "partition", target=0,
                                  baselines=methods.Background(bg)).attributions,
        repeat,
    )  # fmt: skip
    diff = float(np.abs(ours.numpy() - theirs).max())
    floor = _floor(model, x, n * b * 500, repeat)
    name = (
        f"Partition tabular (MLP, {f} features, {n} examples, {b} background rows, max_evals 500)"
    )
    return [name, t_shap, t_ours, t_shap / t_ours, t_ours / floor, diff]


def partition_text(quick: bool, repeat: int, real: bool = False) -> list[Any]:
    import shap
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from model_registry.hf_text import text_hierarchy

    vocab = "the a film was great dull plot , . and but not very"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *vocab.split(" ")]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})
    torch.manual_seed(0)
    layers, hidden = (12, 768) if real else (2, 128)  # BERT-base, or a small BERT
    cfg = BertConfig(vocab_size=len(words), hidden_size=hidden, num_hidden_layers=layers,
                     num_attention_heads=hidden // 64, intermediate_size=4 * hidden,
                     max_position_embeddings=128, num_labels=2)  # fmt: skip
    bert = BertForSequenceClassification(cfg).eval()

    class Ids(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).logits

    model = Ids()
    rng = np.random.default_rng(0)
    n = 1 if real else 2 if quick else 8
    texts = [" ".join(rng.choice(words[5:], 62)) for _ in range(n)]  # 64 tokens each
    ids = torch.tensor([tok(t)["input_ids"] for t in texts])
    special = (ids == tok.cls_token_id) | (ids == tok.sep_token_id)
    base = torch.where(special, ids, torch.full_like(ids, tok.mask_token_id))
    evals = 100 if quick or real else 500
    masker = shap.maskers.Text(tok, output_type="token_ids")
    explainer = shap.PartitionExplainer(_numpy(model, ids=True), masker)
    t_shap, theirs = _timed(
        lambda: np.stack(
            [v[:, 0] for v in explainer(texts, max_evals=evals, outputs=[1], silent=True).values]
        ),
        repeat,
    )

    def ours_fn() -> Any:  # the token trees inside, as shap builds its own per call
        z = [text_hierarchy(tok, t).tolist() for t in texts]
        kw = {"clustering": z, "batch_size": 5, "max_evals": evals}
        return methods.attribute(
            model, ids, "partition", target=1, baselines=base, **kw
        ).attributions

    t_ours, ours = _timed(ours_fn, repeat)
    diff = float(np.abs(ours.numpy() - theirs).max())
    floor = _floor(model, ids, n * evals, repeat)
    name = "BERT-base" if real else "BERT 2 layers x 128"
    name = f"Partition text ({name}, {n} texts of 64 tokens, max_evals {evals})"
    return [name, t_shap, t_ours, t_shap / t_ours, t_ours / floor, diff]


def partition_image(quick: bool, repeat: int, real: bool = False) -> list[Any]:
    import shap

    torch.manual_seed(0)
    if real:
        from transformers import ResNetConfig, ResNetForImageClassification

        side, n, evals, label = 224, 1, 100, "ResNet-50"
        resnet = ResNetForImageClassification(ResNetConfig()).eval()

        class Logits(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.resnet = resnet

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.resnet(pixel_values=x).logits

        model: torch.nn.Module = Logits()
    else:
        side, n, evals, label = (32, 2, 500, "CNN") if quick else (64, 4, 500, "CNN")
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(), torch.nn.Linear(512, 10),
        ).eval()  # fmt: skip
    x = torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(4))
    shape = (side, side, 3)
    masker = shap.maskers.Image("blur(16,16)", shape)
    axis_tree(shape)  # built once per shape, as shap's masker builds its tree when made
    explainer = shap.PartitionExplainer(_numpy(model, shape), masker)
    xl = x.permute(0, 2, 3, 1).numpy()
    t_shap, theirs = _timed(
        lambda: explainer(xl, max_evals=evals, outputs=[1], silent=True).values[..., 0], repeat
    )
    t_ours, ours = _timed(
        lambda: methods.attribute(model, x, "partition", target=1, max_evals=evals).attributions,
        repeat,
    )
    diff = float(np.abs(ours.permute(0, 2, 3, 1).numpy() - theirs).max())
    floor = _floor(model, x, n * evals, repeat)
    name = f"Partition image ({label}, {n} images of {side} px, blur(16,16), max_evals {evals})"
    return [name, t_shap, t_ours, t_shap / t_ours, t_ours / floor, diff]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller cases, one round each")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument(
        "--real", action="store_true",
        help="also BERT-base (64 tokens) and ResNet-50 (224 px), random weights from their "
        "configs, max_evals 100, one run each",
    )  # fmt: skip
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    repeat = 1 if args.quick else 2
    cases: list[Callable[[], list[Any]]] = [
        functools.partial(case, args.quick, repeat)
        for case in (exact, kernel, partition_tabular, partition_text, partition_image)
    ]
    cases.insert(3, functools.partial(partition_tabular, args.quick, repeat, many=True))
    if args.real:
        cases += [
            functools.partial(case, args.quick, 1, real=True)
            for case in (partition_text, partition_image)
        ]
    rows = []
    for case in cases:
        rows.append(case())
        print(rows[-1], flush=True)  # as each is done: a long run's rows are not lost
    headers = ["case", "shap 0.51.0 ms", "attrserve ms", "speed-up", "x forward floor",
               "max |diff|"]  # fmt: skip
    print(table(headers, rows))


if __name__ == "__main__":
    main()
