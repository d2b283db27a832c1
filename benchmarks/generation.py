"""Generative LMs: ``methods.attribute_generation`` vs Captum's ``LLMAttribution``.

``python -m benchmarks.generation [--quick]``. GPT-2 models built from configs (never
downloaded) with a word-level tokenizer built here; a prompt of ~60 tokens with 12 template
slots (baseline ``""``: a slot's words vanish, so perturbed prompts change length) and a
target of 8 tokens. Captum's default (``use_cached_outputs=True``) cannot run here: under
transformers 5 it feeds the whole sequence again on top of its cache at every target token, so
positions overflow (IndexError) or, on short prompts, every token after the first is
mis-scored (README). Captum therefore runs token by token without the cache
(``use_cached_outputs=False``: its authentic path) and with ``forward_in_tokens=False`` (one
forward per perturbed prompt, its fastest). Shapley sampling gets the same permutations on both
sides (Captum's generator is replaced by ours). Times are medians; ``max |diff|`` compares ours
with Captum's token-by-token path, in float32.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

import methods

N_SLOTS, TARGET_TOKENS = 12, 8


def tokenizer(words: list[str]) -> Any:
    import tokenizers
    import transformers

    tk = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>")
    )
    tk.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tk.post_processor = tokenizers.processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", 1)]
    )
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", bos_token="<bos>", eos_token="<eos>"
    )


def gpt2(layers: int, width: int, heads: int, vocab: int) -> Any:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_positions=512, n_embd=width, n_layer=layers, n_head=heads,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()


def case() -> tuple[list[str], str, list[str], str]:
    """Vocabulary, a template of ~60 tokens with 12 slots, the slot values, an 8-token target."""
    words = ["<unk>", "<bos>", "<eos>", *(f"w{i}" for i in range(1000))]
    g = torch.Generator().manual_seed(0)
    pick = lambda n: " ".join(f"w{int(i)}" for i in torch.randint(1000, (n,), generator=g))  # noqa: E731
    parts = [pick(3) for _ in range(N_SLOTS + 1)]
    template = " {} ".join(parts)
    values = [pick(2) for _ in range(N_SLOTS)]
    return words, template, values, pick(TARGET_TOKENS)


def median_s(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    out, times = None, []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def run(name: str, model: Any, tok: Any, method: str, repeat: int) -> dict[str, Any]:
    from captum.attr import FeatureAblation, LLMAttribution, ShapleyValueSampling
    from captum.attr import TextTemplateInput as Template
    from captum.attr._core import shapley_value

    _, template, values, target = case()
    kw: dict[str, Any] = {"n_samples": 25} if method == "shapley_value_sampling" else {}
    seed = 0
    perms = torch.argsort(
        torch.rand((25, N_SLOTS), generator=torch.Generator().manual_seed(seed)), 1
    )

    def same(num_features: int, num_samples: int) -> Iterator[list[int]]:
        yield from perms.tolist()

    shapley_value._perm_generator = same  # the same permutations as ours (seed 0)
    cls = ShapleyValueSampling if method == "shapley_value_sampling" else FeatureAblation
    llm = LLMAttribution(cls(model), tok)
    inp = Template(template, values=values)

    def ours() -> Any:
        return methods.attribute_generation(
            model, tok, template, method, target=target, features=values, seed=seed, **kw
        )

    def captum(in_tokens: bool) -> Callable[[], Any]:
        return lambda: llm.attribute(
            inp, target=target, use_cached_outputs=False, forward_in_tokens=in_tokens, **kw
        )

    ours()  # warm-up
    t_ours, r = median_s(ours, max(repeat, 3))
    t_plain, c = median_s(captum(True), repeat)
    t_seq, _ = median_s(captum(False), repeat)
    diff = max(
        float((r.seq_attr - c.seq_attr).abs().max()),
        float((r.token_attr - c.token_attr).abs().max()),
    )
    prompt_tokens = len(tok.encode(template.format(*values)))
    return {
        "model": name, "method": method, "prompt": prompt_tokens, "ours_s": t_ours,
        "captum_s": t_plain, "captum_seq_s": t_seq, "diff": diff, "stats": r.stats,
        "scale": float(c.seq_attr.abs().max()),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the tiny GPT-2 only, one repeat")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # a shared machine's load then hits both sides alike
    words, *_ = case()
    tok = tokenizer(words)
    configs = [("tiny GPT-2 (2x64)", gpt2(2, 64, 2, len(words)))]
    if not args.quick:
        configs.append(("GPT-2 6x256", gpt2(6, 256, 4, len(words))))
    repeat = 1 if args.quick else args.repeat
    print(
        "| model | method | prompt tokens | ours (s) | Captum token by token (s) | ratio | "
        "Captum one forward per prompt (s) | ratio | max abs diff (max abs attr) | our forwards |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with torch.inference_mode(False):
        for name, model in configs:
            for method in ("feature_ablation", "shapley_value_sampling"):
                r = run(name, model, tok, method, repeat)
                print(
                    f"| {r['model']} | {method} | {r['prompt']} | {r['ours_s']:.3f} | "
                    f"{r['captum_s']:.3f} | {r['ours_s'] / r['captum_s']:.3f} | "
                    f"{r['captum_seq_s']:.3f} | {r['ours_s'] / r['captum_seq_s']:.3f} | "
                    f"{r['diff']:.1e} ({r['scale']:.2f}) | {r['stats']['forwards']} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
