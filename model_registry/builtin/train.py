"""Regenerate the built-in demo models' weights: ``python -m model_registry.builtin.train``.

Each model is trained on its own synthetic data set (see its module for the ground truth) on
the CPU, single-threaded and with deterministic algorithms, from fixed seeds, so a rerun on the
same platform reproduces the committed weights bit for bit (other CPUs may differ in the last
bits; the predictions agree). The whole run takes a few seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from model_registry.builtin import image, lm, noisy, tabular, text

WEIGHTS_DIR = Path(__file__).parent / "weights"


@dataclass(frozen=True)
class Recipe:
    """How one built-in model is made: architecture, data, and optimiser settings."""

    build: Callable[[], nn.Module]
    make_data: Callable[[int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    n_train: int
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float = 0.0
    seed: int = 0


RECIPES: dict[str, Recipe] = {
    "tabular-mlp": Recipe(
        tabular.TabularMLP, tabular.make_data, n_train=4096, epochs=40, batch_size=512,
        lr=1e-2, weight_decay=1e-3, seed=1,
    ),
    "image-cnn": Recipe(
        image.ImageCNN, image.make_data, n_train=1024, epochs=6, batch_size=128, lr=5e-3,
        weight_decay=3e-2, seed=2,
    ),
    "text-classifier": Recipe(
        text.TextClassifier, text.make_data, n_train=4096, epochs=10, batch_size=128,
        lr=1e-2, weight_decay=1e-3, seed=3,
    ),
}  # fmt: skip


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """One thread and deterministic kernels, restored afterwards (reduction order is fixed)."""
    threads = torch.get_num_threads()
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
            yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(threads)


def train(name: str) -> dict[str, torch.Tensor]:
    """Train the built-in model ``name`` from scratch and return its state dict."""
    r = RECIPES[name]
    with deterministic():
        torch.manual_seed(r.seed)  # parameter initialisation draws from the global RNG
        model = r.build()
        gen = torch.Generator().manual_seed(r.seed)
        x, y = r.make_data(r.n_train, gen)
        opt = torch.optim.Adam(model.parameters(), lr=r.lr, weight_decay=r.weight_decay)
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        for _ in range(r.epochs):
            order = torch.randperm(r.n_train, generator=gen)
            for start in range(0, r.n_train, r.batch_size):
                idx = order[start : start + r.batch_size]
                opt.zero_grad()
                loss_fn(model(x[idx]), y[idx]).backward()
                opt.step()
        model.eval()
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def accuracy(name: str, model: nn.Module, n: int = 2000, seed: int = 12345) -> float:
    """Accuracy of ``model`` on a fresh synthetic set (a seed the training never used)."""
    x, y = RECIPES[name].make_data(n, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return float((model(x).argmax(1) == y).double().mean())


def metadata(name: str) -> dict[str, str]:
    """The header stored with the weights, as one JSON value.

    One key only: safetensors writes its metadata map in hash order, so several keys would make
    the file bytes differ between otherwise identical runs.
    """
    r = RECIPES[name]
    meta: dict[str, object] = {
        "model": name,
        "recipe": {
            "n_train": r.n_train, "epochs": r.epochs, "batch_size": r.batch_size,
            "lr": r.lr, "weight_decay": r.weight_decay, "seed": r.seed,
        },
    }  # fmt: skip
    if name == "text-classifier":
        meta["vocab"] = list(text.VOCAB)  # the loader refuses weights made for another vocab
    return {"attrserve": json.dumps(meta, sort_keys=True)}


#: trained by SGD on labels of which some are wrong, its data and checkpoints kept
NOISY_NAME = "tabular-noisy"
#: the causal language model is trained on next tokens, not classes (``lm.train``)
LM_NAME = "tiny-lm"


def train_lm() -> tuple[dict[str, torch.Tensor], float, dict[str, str]]:
    """tiny-lm's state dict, its accuracy on every (filler, name) prompt, and its header."""
    with deterministic():
        state = lm.train()
    model = lm.TinyLM()
    model.load_state_dict(state)
    model.eval()
    meta = {"model": LM_NAME, "vocab": list(lm.VOCAB), "recipe": "model_registry.builtin.lm.train"}
    return state, lm.accuracy(model), {"attrserve": json.dumps(meta, sort_keys=True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = [*RECIPES, LM_NAME, NOISY_NAME]
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {every}; default: all")
    parser.add_argument("--out", type=Path, default=WEIGHTS_DIR, help="output directory")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(every))
    if unknown:
        parser.error(f"unknown built-in model(s) {unknown}; choose from {every}")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or every:
        t0 = time.perf_counter()
        if name == LM_NAME:
            state, acc, meta = train_lm()
        elif name == NOISY_NAME:
            with deterministic():
                state, _ = noisy.train()
                noisy.write()
            mlp = tabular.TabularMLP()
            mlp.load_state_dict(state)
            acc = accuracy("tabular-mlp", mlp.eval())
            meta = {
                "attrserve": json.dumps(
                    {"model": name, "recipe": "model_registry.builtin.noisy.train"}, sort_keys=True
                )
            }
        else:
            state = train(name)
            model = RECIPES[name].build()
            model.load_state_dict(state)
            model.eval()
            acc, meta = accuracy(name, model), metadata(name)
        path = args.out / f"{name}.safetensors"
        save_file(state, str(path), metadata=meta)
        print(
            f"{name}: accuracy {acc:.4f} on fresh data, {time.perf_counter() - t0:.1f} s, "
            f"{path.stat().st_size / 1024:.0f} KiB -> {path}"
        )


if __name__ == "__main__":
    main()
