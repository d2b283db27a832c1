"""Contrastive attribution (why this answer rather than that one) by token ablation: attrserve
against inseq 0.7.1's occlusion with its ``contrast_prob_diff`` step function, in one process.

    python -m benchmarks.contrast [--prompt-words 24] [--answer-words 8] [--layers 6] [--width 512]

Both remove one prompt token at a time and score, at every answer step, the target token's
probability minus the contrast token's. inseq occludes a token's embedding (zeros) and runs
its attribution step by step (one forward per answer token and occlusion); attrserve replaces
the token's id (by the pad token, whose embedding is zeroed here) and scores every answer step
of every ablated prompt in batched, prefix-cached forwards. The work is the same; the numbers
are not compared (inseq takes the contrast token's probability after the contrast's own
earlier tokens, see docs/python-api.md). A GPT-2 built from a
config (random weights), its vocabulary 50,257, a byte-level BPE trained here.
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import torch

import methods
from benchmarks.context import WORDS, build
from benchmarks.timing import table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt-words", type=int, default=24)
    ap.add_argument("--answer-words", type=int, default=8)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--width", type=int, default=512)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import inseq

    prompt = " ".join(WORDS[: args.prompt_words])
    target = " " + " ".join(WORDS[args.prompt_words : args.prompt_words + args.answer_words])
    model, tok = build(args.layers, args.width, " ".join(WORDS))
    with torch.no_grad():  # the pad token's embedding is the ablated token's: zeros
        model.get_input_embeddings().weight[0].zero_()
    ids = tok.encode(target)
    contrast = tok.decode(list(reversed(ids)))
    if len(tok.encode(contrast)) != len(ids):
        contrast = tok.decode([ids[-1]] * len(ids))
    with torch.no_grad():
        model(torch.tensor([tok.encode(prompt)]))  # warm-up
    rows: list[list[Any]] = []

    t0 = time.perf_counter()
    theirs_model = inseq.load_model(model, "occlusion", tokenizer=tok)
    out = theirs_model.attribute(
        prompt, prompt + target, attributed_fn="contrast_prob_diff",
        contrast_targets=prompt + contrast, show_progress=False,
    )  # fmt: skip
    t_inseq = time.perf_counter() - t0
    if not out.sequence_attributions:
        raise RuntimeError("inseq returned no attribution")
    t0 = time.perf_counter()
    methods.attribute_generation(
        model, tok, prompt, "feature_ablation", target=target, target_fn="contrast",
        contrast_target=contrast, contrast_fn="prob",
    )  # fmt: skip
    t_ours = time.perf_counter() - t0
    rows.append(["inseq occlusion, contrast_prob_diff", t_inseq, t_inseq / t_ours])
    rows.append(["attrserve feature_ablation, target_fn=contrast", t_ours, 1.0])
    print(
        f"GPT-2 shape {args.layers}x{args.width}; prompt {len(tok.encode(prompt))} tokens, "
        f"answer and contrast {len(ids)} tokens; torch threads {torch.get_num_threads()}"
    )
    print(table(["who", "seconds", "x attrserve"], rows))


if __name__ == "__main__":
    main()
