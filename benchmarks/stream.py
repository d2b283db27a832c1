"""Streaming a generation attribution: how soon the first token's row comes, against the time
of that one step's attribution alone, and what the whole stream costs against the attribution
without a stream. One process, GPT-2 small's shape (random weights), greedy answers.

    python -m benchmarks.stream [--prompt-words 24] [--new-tokens 12] [--layers 12]

Rows per method:
- one step alone: ``attribute_generation`` with the answer's first token as the target;
- first streamed row: ``stream_generation`` until its first ``GenerationStep``;
- whole stream: every row and the result;
- without a stream: ``attribute_generation`` generating the same answer.
Goal (issue 39): first streamed row <= 2x one step alone.
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
    ap.add_argument("--new-tokens", type=int, default=12)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    prompt = " ".join(WORDS[: args.prompt_words])
    model, tok = build(args.layers, args.width, " ".join(WORDS))
    gen = {"max_new_tokens": args.new_tokens}
    with torch.no_grad():  # warm-up
        model(torch.tensor([tok.encode(prompt)]))
    rows: list[list[Any]] = []
    for method, kw in (("feature_ablation", {}), ("input_x_gradient", {})):
        t0 = time.perf_counter()
        whole = methods.attribute_generation(model, tok, prompt, method, gen_args=gen, **kw)
        t_whole = time.perf_counter() - t0
        first_id = whole.output_ids[:1]
        t0 = time.perf_counter()
        methods.attribute_generation(model, tok, prompt, method, target=first_id, **kw)
        t_one = time.perf_counter() - t0
        t0 = time.perf_counter()
        stream = methods.stream_generation(model, tok, prompt, method, gen_args=gen, **kw)
        first = next(stream)
        t_first = time.perf_counter() - t0
        rest = list(stream)
        t_stream = time.perf_counter() - t0
        result = rest[-1]
        if not isinstance(first, methods.GenerationStep) or not isinstance(
            result, methods.GenerationResult
        ):
            raise RuntimeError("the stream did not yield steps then a result")
        diff = float((result.token_attr - whole.token_attr).abs().max())
        n = len(whole.output_ids)
        rows += [
            [method, "one step alone", t_one, 1.0, ""],
            [method, "first streamed row", t_first, t_first / t_one, ""],
            [method, f"whole stream ({n} tokens)", t_stream, t_stream / t_one, f"{diff:.1e}"],
            [method, "without a stream", t_whole, t_whole / t_one, ""],
        ]
    n_prompt = len(tok.encode(prompt))
    print(
        f"GPT-2 shape {args.layers}x{args.width}, vocabulary 50257; prompt {n_prompt} tokens "
        f"(each a feature), greedy answer of {args.new_tokens} tokens, torch threads "
        f"{torch.get_num_threads()}"
    )
    print(table(["method", "what", "seconds", "x one step", "max |diff| vs whole"], rows))


if __name__ == "__main__":
    main()
