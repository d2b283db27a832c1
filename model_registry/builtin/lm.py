"""``tiny-lm``: a small causal language model in plain torch, with a word-level tokenizer.

Ground truth: it is trained on facts "<filler> <name> lives in <city> ." where each name has
one city (``FACTS``) and the filler (``FILLERS``, an optional adjective) carries nothing. Asked
"my old friend alice lives in", it answers alice's city, and attributing that answer puts
most of the score on the name.

The model speaks attrserve's KV protocol (``forward_cached``), so attributions reuse the
key/value cache of a prompt's shared prefix. Pre-norm transformer blocks, learned positions,
the output head tied to the token embedding.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")
CITIES = ("paris", "rome", "oslo", "lima", "cairo", "tokyo", "delhi", "quito", "dakar", "hanoi")
#: who lives where: NAMES[i] lives in CITIES[FACTS[i]]
FACTS = (3, 7, 0, 5, 9, 1, 4, 8, 2, 6)
FILLERS = (
    "", "my friend", "my old friend", "the neighbour", "we know that", "today", "they say",
    "i think", "the teacher", "our cousin", "as usual", "the young doctor",
)  # fmt: skip
ADJECTIVES = ("", "old", "young", "kind", "tall")
WORDS = ("lives", "in", ".", "my", "friend", "old", "the", "neighbour", "we", "know", "that",
         "today", "they", "say", "i", "think", "teacher", "our", "cousin", "as", "usual",
         "young", "doctor", "kind", "tall")  # fmt: skip
VOCAB: tuple[str, ...] = (PAD, UNK, BOS, EOS, *NAMES, *CITIES, *dict.fromkeys(WORDS))
WIDTH, LAYERS, HEADS, MAX_POSITIONS = 48, 2, 4, 64
EMBEDDING_LAYER = "embed"

_WORD = re.compile(r"<[a-z]+>|[a-z]+|\.")


class TinyTokenizer:
    """Word-level, lower-cased; the subset of a Hugging Face tokenizer's API that
    ``methods.attribute_generation`` (and Captum's LLM classes) use. ``encode`` prepends
    ``<bos>`` unless ``add_special_tokens=False``; unknown words become ``<unk>``."""

    def __init__(self, vocab: Sequence[str] = VOCAB) -> None:
        self.vocab = tuple(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.pad_token_id, self.unk_token_id = self.index[PAD], self.index[UNK]
        self.bos_token_id, self.eos_token_id = self.index[BOS], self.index[EOS]
        self.all_special_ids = [
            self.pad_token_id,
            self.unk_token_id,
            self.bos_token_id,
            self.eos_token_id,
        ]

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        return _WORD.findall(text.lower())

    def encode(
        self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None
    ) -> Any:
        ids = [self.index.get(w, self.unk_token_id) for w in self.tokenize(text)]
        if add_special_tokens:
            ids = [self.bos_token_id, *ids]
        return torch.tensor([ids], dtype=torch.long) if return_tensors == "pt" else ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, Tensor):
            ids = ids.reshape(-1).tolist()
        if isinstance(ids, int):
            ids = [ids]
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        return " ".join(self.vocab[i] for i in ids if i not in skip)

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        if isinstance(ids, int):
            return self.vocab[ids]
        return [self.vocab[int(i)] for i in ids]

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            return self.index.get(tokens, self.unk_token_id)
        return [self.index.get(t, self.unk_token_id) for t in tokens]


class Block(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(
        self, x: Tensor, past: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        b, s, w = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=-1)
        q, k, v = (t.reshape(b, s, h, w // h).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        p = int(k.shape[2]) - s
        scores = q @ k.transpose(-1, -2) / math.sqrt(w // h)
        # causal: query i (position p + i) sees keys 0 .. p + i
        allowed = (
            torch.arange(p + s, device=x.device)[None]
            <= (p + torch.arange(s, device=x.device))[:, None]
        )
        scores = scores.masked_fill(~allowed, float("-inf"))
        att = torch.softmax(scores, dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, w))
        return x + self.mlp(self.ln2(x)), (k, v)


class TinyLM(nn.Module):
    """ids [B, L] -> next-token logits [B, L, vocab]."""

    embedding_layer = EMBEDDING_LAYER
    max_positions = MAX_POSITIONS

    def __init__(
        self, vocab_size: int = len(VOCAB), width: int = WIDTH, layers: int = LAYERS
    ) -> None:
        super().__init__()
        self.vocab_size, self.width = vocab_size, width
        self.embed = nn.Embedding(vocab_size, width)
        self.pos = nn.Embedding(MAX_POSITIONS, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(layers))
        self.ln = nn.LayerNorm(width)

    def forward_cached(
        self, ids: Tensor, past: Sequence[tuple[Tensor, Tensor]] | None = None, keep_from: int = 0
    ) -> tuple[Tensor, tuple[tuple[Tensor, Tensor], ...]]:
        """Logits of ``ids`` continuing ``past`` (per layer keys and values [B, heads, P, d]),
        from position ``keep_from`` of ``ids`` on, and the cache extended by ``ids``."""
        start = 0 if past is None else int(past[0][0].shape[2])
        positions = torch.arange(start, start + int(ids.shape[1]), device=ids.device)
        x = self.embed(ids) + self.pos(positions)[None]
        cache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if past is None else past[i])
            cache.append(kv)
        x = self.ln(x[:, keep_from:])
        return x @ self.embed.weight.T, tuple(cache)

    def forward(self, ids: Tensor) -> Tensor:
        return self.forward_cached(ids)[0]


def make_data(n: int, generator: torch.Generator) -> list[list[int]]:
    """``n`` training sentences as token ids: <bos> filler [adjective] name lives in city . <eos>"""
    tok = TinyTokenizer()
    out = []
    for _ in range(n):
        f = FILLERS[int(torch.randint(len(FILLERS), (1,), generator=generator))]
        a = ADJECTIVES[int(torch.randint(len(ADJECTIVES), (1,), generator=generator))]
        i = int(torch.randint(len(NAMES), (1,), generator=generator))
        text = f"{f} {a} {NAMES[i]} lives in {CITIES[FACTS[i]]} ."
        out.append([*tok.encode(text), tok.eos_token_id])
    return out


def train(seed: int = 4, steps: int = 400, batch: int = 64, lr: float = 3e-3) -> dict[str, Tensor]:
    """Next-token training on ``make_data`` sentences (called under train.deterministic())."""
    torch.manual_seed(seed)
    model = TinyLM()
    gen = torch.Generator().manual_seed(seed)
    data = make_data(steps * batch // 4, gen)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for step in range(steps):
        idx = torch.randint(len(data), (batch,), generator=gen).tolist()
        rows = [data[i] for i in idx]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
        logits = model(ids[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), ignore_index=0
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == steps // 2:
            for g in opt.param_groups:
                g["lr"] = lr / 3
    model.eval()
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def accuracy(model: TinyLM) -> float:
    """How often greedy decoding after "<filler> <name> lives in" gives the name's city."""
    tok = TinyTokenizer()
    hits = total = 0
    with torch.no_grad():
        for f in FILLERS:
            for i, name in enumerate(NAMES):
                ids = torch.tensor([tok.encode(f"{f} {name} lives in")])
                hits += int(model(ids)[0, -1].argmax()) == tok.index[CITIES[FACTS[i]]]
                total += 1
    return hits / total
