"""A Hugging Face text classifier over HTTP against the way transformers-interpret runs.

    python -m benchmarks.hf_text [--clients 16] [--texts 96] [--n-steps 50]

A small BERT-style classifier (2 layers, hidden 64, random weights, saved with
``save_pretrained`` and served with ``source = "hf:DIR"``): layer integrated gradients on the
word embeddings for ``--texts`` texts of 16 to 40 words. attrserve gets them from ``--clients``
concurrent clients, one text per request. Two peers: a loop of Captum's
``LayerIntegratedGradients`` calls, one text at a time in one process (no HTTP cost), and the
naive server (FastAPI + the same Captum call per request, in FastAPI's thread pool), which
gets the same requests from the same clients. Texts per second, and the ratios. Not a timed
test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from benchmarks.load import start, stop

WORDS = [f"w{i}" for i in range(1000)]


def build(root: Path, size: str = "tiny") -> Path:
    """The classifier's directory and a models.toml serving it: ``tiny`` (2 layers of 64) or
    ``base`` (BERT-base's default config: 12 layers of 768, 110M parameters)."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(0)
    if size == "base":
        cfg = BertConfig(num_labels=2)
    else:
        cfg = BertConfig(vocab_size=len(WORDS) + 5, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128,
                         max_position_embeddings=64, num_labels=2)  # fmt: skip
    BertForSequenceClassification(cfg).save_pretrained(root / "bert")
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    BertTokenizerFast(vocab=vocab).save_pretrained(root / "bert")
    (root / "models.toml").write_text('[[models]]\nid = "bert"\nsource = "hf:bert"\n')
    return root / "models.toml"


def texts(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    return [" ".join(rng.choice(WORDS, int(rng.integers(16, 41)))) for _ in range(n)]


def captum_one(path: Path, n_steps: int) -> Callable[[str], np.ndarray]:
    """Captum's LayerIntegratedGradients on one text: its attributions, one per token, summed
    over the embedding dim (as attrserve answers)."""
    from captum.attr import LayerIntegratedGradients
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)

    def forward(ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits

    lig = LayerIntegratedGradients(forward, model.get_input_embeddings())

    def one(text: str) -> np.ndarray:
        enc = tok(text, return_tensors="pt", return_special_tokens_mask=True)
        ids = enc["input_ids"]
        base = torch.where(enc["special_tokens_mask"].bool(), ids, torch.zeros_like(ids))
        args = (enc["attention_mask"], enc["token_type_ids"])
        a = lig.attribute(ids, baselines=base, target=1, n_steps=n_steps,
                          additional_forward_args=args)  # fmt: skip
        return a.sum(-1)[0].detach().numpy()

    return one


def timed_loop(
    one: Callable[[Any], np.ndarray], batch: list[Any]
) -> tuple[float, list[np.ndarray]]:
    """Examples per second of ``one`` over the batch, one at a time, and its answers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one(batch[0])  # warm up
        t0 = time.perf_counter()
        out = [one(example) for example in batch]
    return len(batch) / (time.perf_counter() - t0), out


def naive_app(one: Callable[[Any], np.ndarray]) -> Any:
    """The server a user would otherwise write: FastAPI and one Captum call per example
    (``benchmarks.load.minimal_app`` for Hugging Face directories). One call at a time: the
    layer method's hooks on the shared model are not thread-safe (from FastAPI's thread pool
    unlocked, concurrent texts answered 500, "size of tensor a (38) must match ... (33)")."""
    from fastapi import FastAPI

    app = FastAPI()
    lock = threading.Lock()

    @app.post("/v1/models/{model_id}/attributions")
    def attribute(model_id: str, body: dict[str, Any]) -> dict[str, Any]:
        with lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return {"attributions": [one(example).tolist() for example in body["inputs"]]}

    return app


def serve_naive(args: argparse.Namespace, one: Callable[[Any], np.ndarray]) -> None:
    import uvicorn

    port = int(args.serve_naive[1])
    uvicorn.run(naive_app(one), host="127.0.0.1", port=port, log_level="warning", access_log=False)


async def over_http(
    url: str,
    batch: list[Any],
    clients: int,
    n_steps: int | str,
    model: str = "bert",
    precision: str | None = None,
) -> tuple[float, list[np.ndarray]]:
    """Examples per second, one example per request (integrated gradients, target 1) from
    ``clients`` concurrent clients, and the answers' attributions in the batch's order."""
    queue = list(enumerate(batch))
    answers: list[np.ndarray] = [np.zeros(0)] * len(batch)
    # the longest deadline a server allows: at real sizes, requests queue behind each other
    # for longer than the default 30 s
    body: dict[str, Any] = {
        "method": "integrated_gradients", "target": 1, "params": {"n_steps": n_steps},
        "deadline_ms": 300000,
    }  # fmt: skip
    if precision is not None:
        body["precision"] = precision
    route = f"/v1/models/{model}/attributions"
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await client.post(route, json={**body, "inputs": batch[:1]})

        async def worker() -> None:
            while queue:
                i, example = queue.pop()
                r = await client.post(route, json={**body, "inputs": [example]})
                r.raise_for_status()
                answers[i] = np.asarray(r.json()["attributions"][0], dtype=np.float64)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return len(batch) / (time.perf_counter() - t0), answers


def worst_rel_l2(ours: list[np.ndarray], theirs: list[np.ndarray]) -> float:
    """The largest relative L2 distance of an answer from the Captum loop's."""
    return max(
        float(np.linalg.norm(o.reshape(-1) - t.reshape(-1)) / np.linalg.norm(t.reshape(-1)))
        for o, t in zip(ours, theirs, strict=True)
    )


def arguments(prog: str, doc: str | None, count: str, default: int) -> argparse.Namespace:
    """The command line both Hugging Face benchmarks take (``count``: how many examples)."""
    p = argparse.ArgumentParser(prog=prog, description=doc)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument(f"--{count}", type=int, default=default, dest="count")
    p.add_argument("--n-steps", type=int, default=50)
    p.add_argument(
        "--auto-steps", action="store_true",
        help='attrserve\'s requests ask n_steps "auto" (fewest evaluations for the default '
        "delta_tolerance); the Captum loop keeps --n-steps, and the table adds how far "
        "attrserve's answers are from its (worst relative L2)",
    )  # fmt: skip
    p.add_argument(
        "--threads", type=int, default=1,
        help="torch threads of the Captum loop and of each attrserve worker (0: each's own "
        "default: torch's for Captum, the server's rule for attrserve)",
    )  # fmt: skip
    p.add_argument("--workers", type=int, default=1, help="attrserve workers")
    p.add_argument(
        "--size", choices=("tiny", "base"), default="tiny",
        help="tiny: 2 layers of 64 (the default); base: the architecture's default config "
        "(BERT-base, ViT-B/16 at 224 px)",
    )  # fmt: skip
    p.add_argument("--no-naive", action="store_true", help="skip the naive server peer")
    p.add_argument("--serve-naive", nargs=2, metavar=("DIR", "PORT"), help=argparse.SUPPRESS)
    p.add_argument(
        "--precision", default=None,
        help="attrserve's precision per request (float32, bfloat16, float16, auto); unset: "
        "the model's dtype",
    )  # fmt: skip
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def compare(
    args: argparse.Namespace,
    module: str,
    build: Callable[[Path, str], Path],
    captum: Callable[[Path, int], tuple[float, list[np.ndarray]]],
    batch: list[Any],
    model: str,
) -> tuple[float, float, float | None, float]:
    """Examples/s of attrserve serving ``build``'s directory (``model``) over HTTP, of
    ``captum(directory, n_steps)``, run first, alone, and of ``module``'s naive server (None
    with ``--no-naive``); and the worst relative L2 distance of attrserve's answers from
    Captum's."""
    with tempfile.TemporaryDirectory() as tmp:
        toml = build(Path(tmp), args.size)
        theirs, reference = captum(Path(tmp) / model, args.n_steps)
        naive = None
        if not args.no_naive:
            argv = [module, "--n-steps", str(args.n_steps), "--threads", str(args.threads),
                    "--serve-naive", str(Path(tmp) / model)]  # fmt: skip
            proc, url = start("peer", argv=argv)
            try:
                naive, plain = asyncio.run(over_http(url, batch, args.clients, args.n_steps, model))
            finally:
                stop(proc)
            if worst_rel_l2(plain, reference) > 1e-5:
                raise RuntimeError("the naive server's answers are not Captum's")
        settings = {"torch_threads": args.threads} if args.threads else {}
        proc, url = start("attrserve", models=toml, workers=args.workers, **settings)
        steps: int | str = "auto" if args.auto_steps else args.n_steps
        try:
            ours, answers = asyncio.run(
                over_http(url, batch, args.clients, steps, model, args.precision)
            )
        finally:
            stop(proc)
    return ours, theirs, naive, worst_rel_l2(answers, reference)


def table(
    args: argparse.Namespace,
    unit: str,
    case: str,
    ours: float,
    captum: float,
    naive: float | None,
    rel: float,
) -> None:
    print(f"| case | attrserve {unit}/s | Captum loop {unit}/s | ratio | naive server {unit}/s "
          "| ratio | worst rel. L2 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    threads = args.threads or "default"
    precision = f", {args.precision}" if args.precision else ""
    auto = ', attrserve n_steps "auto"' if args.auto_steps else ""
    vs_naive = "- | -" if naive is None else f"{naive:.3g} | {ours / naive:.2f}"
    label = f"{case}, {args.clients} clients, {args.workers} worker(s), {threads} thread(s)"
    print(f"| {label}{precision}{auto} | {ours:.3g} | {captum:.3g} | {ours / captum:.2f} | "
          f"{vs_naive} | {rel:.2g} |")  # fmt: skip


def main() -> None:
    args = arguments("benchmarks.hf_text", __doc__, "texts", 96)
    if args.serve_naive:
        serve_naive(args, captum_one(Path(args.serve_naive[0]), args.n_steps))
        return
    batch = texts(args.count)
    ours, captum, naive, rel = compare(
        args, "benchmarks.hf_text", build,
        lambda path, n: timed_loop(captum_one(path, n), batch), batch, "bert",
    )  # fmt: skip
    name = "BERT-base" if args.size == "base" else "BERT 2x64"
    table(args, "texts", f"{name}, {args.count} texts of 16-40 words, layer IG "
          f"n_steps={args.n_steps}", ours, captum, naive, rel)  # fmt: skip


if __name__ == "__main__":
    main()
