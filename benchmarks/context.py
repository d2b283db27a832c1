"""Context attribution on a GPT-2-sized model: attrserve against context-cite's own loop, in
one process, on the same masks.

    python -m benchmarks.context [--ablations 64] [--sentences 20] [--layers 12] [--width 768]

The model is GPT-2 small's shape (12 layers, 768 wide, 50,257-token vocabulary; random
weights: the time does not depend on them); the tokenizer a byte-level BPE trained here on the
context (no download), with a chat template. The context is ``--sentences`` sentences, the
answer three, given (both sides skip generating it). Rows:

- context-cite 0.0.4, ``ContextCiter.get_attributions`` for each answer sentence (its masks and
  scores are computed once and cached, then one Lasso per sentence), with its default
  ``batch_size=1`` and with ``batch_size=8`` (left padding, as it requires);
- ``methods.attribute_context``: every answer sentence from one set of batched, prefix-cached
  forwards.

Each is timed once after a warm-up forward (a run is seconds). The scores are compared too.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

import methods
from benchmarks.timing import table

TEXT = (
    "the council approved a new budget for public transport after a long debate "
    "river levels rose sharply during the spring storms across the northern valley "
    "engineers tested the bridge with heavy trucks before opening it to traffic "
    "the museum will display ancient coins found by farmers near the old harbour "
    "local schools added evening classes in music painting and computer science"
)
WORDS = tuple(TEXT.split())


def sentences(n: int, seed: int = 0) -> list[str]:
    g = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = list(g.choice(WORDS, size=int(g.integers(12, 20))))
        out.append(f"Item {i} says " + " ".join(words) + ".")
    return out


def build(layers: int, width: int, context: str) -> tuple[Any, Any]:
    import tokenizers
    import transformers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator([context] * 5, vocab_size=1000, special_tokens=["<|endoftext|>"])
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    tok.chat_template = (
        "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=width, n_layer=layers,
        n_head=max(1, width // 64), bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval(), tok


def context_cite(nltk_dir: str) -> Any:
    """The package, imported offline (as tests/methods/test_generation_context.py does)."""
    import nltk

    english = Path(nltk_dir) / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in ("collocations.tab", "sent_starters.txt", "ortho_context.tab", "abbrev_types.txt"):
        (english / name).write_text("")
    nltk.data.path.insert(0, nltk_dir)
    nltk.download = lambda *a, **k: True
    import context_cite as cc

    return cc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ablations", type=int, default=64)
    ap.add_argument("--sentences", type=int, default=20)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TQDM_DISABLE", "1")
    units = sentences(args.sentences)
    context = " ".join(units)
    answer_sents = sentences(3, seed=1)
    answer = " " + " ".join(answer_sents)
    query = "What do the items say?"
    model, tok = build(args.layers, args.width, context + answer)
    cc = context_cite(tempfile.mkdtemp())
    template = "{context}\n\n{query}"
    n = args.ablations
    with torch.no_grad():  # warm-up
        model(torch.tensor([tok.encode(context)[:256]]))

    rows: list[list[Any]] = []
    theirs: dict[int, np.ndarray] = {}
    for batch in (1, 8):
        tok.padding_side = "left"
        citer = cc.ContextCiter(model, tok, context, query, num_ablations=n, batch_size=batch,
                                prompt_template=template)  # fmt: skip
        _, prompt = citer._get_prompt_ids(return_prompt=True)
        citer._cache["output"] = prompt + answer
        t0 = time.perf_counter()
        found = []
        for s in answer_sents:
            a = citer.response.index(s)
            found.append(citer.get_attributions(a, a + len(s), verbose=False))
        took = time.perf_counter() - t0
        theirs[batch] = np.stack(found)
        rows.append([f"context-cite, batch_size={batch}", took, n, 0.0])
    prompt_tokens = len(citer._get_prompt_ids())

    t0 = time.perf_counter()
    res = methods.attribute_context(model, tok, context, query, answer, n_ablations=n,
                                    score="logit_prob", prompt_template=template)  # fmt: skip
    ours = time.perf_counter() - t0
    diff = float(np.abs(res.scores.numpy() - theirs[1]).max())
    rows.append(["attrserve", ours, res.stats["forwards"], diff])
    out = [[name, secs, calls, secs / ours, d] for name, secs, calls, d in rows]
    print(f"GPT-2 shape {args.layers}x{args.width}, vocabulary 50257; {args.sentences} context "
          f"sentences ({prompt_tokens} prompt tokens), 3 answer sentences "
          f"({len(res.answer_ids)} tokens), {n} ablations, torch threads "
          f"{torch.get_num_threads()}")  # fmt: skip
    print(table(["who", "seconds", "forwards", "x attrserve", "max |score diff|"], out))
    print("attrserve stats:", res.stats)


if __name__ == "__main__":
    main()
