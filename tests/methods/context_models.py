"""Models and a tokenizer for context attribution tests, built offline in code.

- ``bpe_tokenizer()``: a byte-level BPE (GPT-2's kind) trained here on a few sentences, with a
  chat template: texts round-trip exactly, as with real LLM tokenizers.
- ``CopyLM``: a model made to copy: at each position every earlier occurrence of the current
  token votes for the token that followed it (an induction head, hard-wired). An answer
  sentence that repeats a context sentence is likely exactly when that sentence is in the
  prompt. It takes ``input_ids`` (and ignores masks and labels) as a Hugging Face model does
  and returns ``.logits``.
- ``random_gpt2()``: a small GPT-2 with large random weights, whose answers depend strongly and
  non-linearly on the context.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import tokenizers
import torch
import transformers
from torch import nn

CORPUS = [
    "Paris is the capital of France. The secret code is blue seven. Bob likes green apples.",
    "The weather in Rome was sunny. Alice works at the bank. Where does Alice work?",
    "Marco sails a red boat on the lake. The train to Oslo leaves at noon.",
    "Every Tuesday the market sells fresh bread. Who likes apples? What is the code?",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@functools.cache
def _trained() -> Any:
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        CORPUS * 10, vocab_size=420, min_frequency=1, special_tokens=["<|endoftext|>"]
    )
    return bpe._tokenizer


def bpe_tokenizer(chat: bool = True) -> Any:
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_trained(), eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )
    if chat:
        tok.chat_template = CHAT_TEMPLATE
    return tok


class CopyLM(nn.Module):
    """Logits [B, L, V]: ``strength`` for each token that followed an earlier occurrence of the
    current token, 0 elsewhere."""

    def __init__(self, vocab: int, strength: float = 6.0) -> None:
        super().__init__()
        self.vocab, self.strength = vocab, strength
        self.device = torch.device("cpu")  # context-cite reads model.device

    def forward(self, input_ids: torch.Tensor, **_: Any) -> Any:
        ids = input_ids
        n = ids.shape[1]
        same = ids[:, :, None] == ids[:, None, :]  # [B, i, j]
        earlier = torch.ones(n, n, dtype=torch.bool).tril(-1)[None]
        votes = (same & earlier)[:, :, :-1].to(torch.float32)  # j < n - 1: it has a successor
        nxt = torch.nn.functional.one_hot(ids[:, 1:], self.vocab).to(torch.float32)
        logits = self.strength * votes @ nxt  # [B, L, V]
        return SimpleNamespace(logits=logits)


def random_gpt2(vocab: int, positions: int = 512) -> Any:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=vocab, n_positions=positions, n_embd=32, n_layer=2, n_head=2,
        initializer_range=0.5, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(cfg).eval()
