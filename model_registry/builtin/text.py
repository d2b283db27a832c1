"""``text-classifier``: token ids in, (negative, positive) out; sentiment words decide.

Ground truth: training sentences are neutral filler words with one or two sentiment words of a
single polarity; the class is that polarity. The model is a bag of embeddings (masked mean over
the non-pad tokens) read out by a small MLP, so the sentiment word carries the decision and a
faithful per-token attribution ranks it first.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

import torch
from torch import nn

LABELS = ("negative", "positive")
LAYERS = ("embedding", "fc1", "fc2")
EMBEDDING_LAYER = "embedding"
PAD, UNK = "[PAD]", "[UNK]"
PAD_ID, UNK_ID = 0, 1

NEGATIVE = (
    "bad", "terrible", "awful", "boring", "hate", "hated", "worst", "poor", "dull",
    "horrible", "disappointing", "waste", "ugly", "mediocre", "weak", "annoying",
)  # fmt: skip
POSITIVE = (
    "good", "great", "excellent", "wonderful", "love", "loved", "amazing", "best",
    "fantastic", "enjoyable", "brilliant", "delightful", "superb", "fun", "beautiful", "perfect",
)  # fmt: skip
NEUTRAL = (
    "the", "a", "an", "movie", "film", "plot", "story", "acting", "actors", "this", "that",
    "it", "was", "is", "were", "and", "of", "to", "in", "with", "very", "really", "quite",
    "ending", "music", "script", "characters", "scene", "scenes", "i", "we", "they",
    "director", "performance", "so", "too", "at", "for", "on", "book", "show", "cast",
)  # fmt: skip
#: the fixed vocabulary; an id is a position in this tuple (the weights depend on the order)
VOCAB: tuple[str, ...] = (PAD, UNK, *NEGATIVE, *POSITIVE, *NEUTRAL)
EMBED_DIM = 16

#: emoji modifiers (skin tones) and tag characters (subdivision flags): part of the symbol
#: they follow
_MODIFIERS = range(0x1F3FB, 0x1F400)
_TAGS = range(0xE0020, 0xE0080)
_REGIONAL = range(0x1F1E6, 0x1F200)  # two make a flag
_JOINERS = ("\u200c", "\u200d")  # zero-width (non-)joiners, inside a word or an emoji


def _kind(c: str) -> str | None:
    """``"w"`` a word's character (a letter or digit), ``"m"`` a mark (it joins what it
    follows), ``"s"`` a character that is a token by itself (an emoji, a symbol, one Unicode
    does not know yet), None a separator (white space, punctuation, a control)."""
    category = unicodedata.category(c)
    if category[0] in "LN":
        return "w"
    if category[0] == "M":
        return "m"
    if category[0] in "PZ" or category in ("Cc", "Cf") or c.isspace():
        return None
    return "s"


def split_words(text: str) -> list[str]:
    """The tokens of ``text`` as written (lower-cased): runs of letters and digits (one
    apostrophe inside, as in "don't"), and each other character that is neither white space
    nor punctuation (an emoji with its modifiers and joined parts, a symbol). Punctuation
    separates and is dropped."""
    text = text.lower()
    return [text[a:b] for a, b in _token_spans(text)]


def word_offsets(text: str) -> list[tuple[int, int]]:
    """Each token's characters in ``text`` as given (``split_words`` reads it lower-cased,
    which may lengthen a character: "İ" is two): start and end offsets."""
    lowered, owner = [], []  # each lower-cased character's index in the text
    for i, c in enumerate(text):
        low = c.lower()
        lowered.append(low)
        owner.extend([i] * len(low))
    owner.append(len(text))
    return [(owner[a], owner[b - 1] + 1) for a, b in _token_spans(text.lower())]


def _token_spans(text: str) -> list[tuple[int, int]]:
    """The tokens of a lower-cased ``text`` as (start, end) offsets."""
    out: list[tuple[int, int]] = []
    start, kind = -1, None
    for i, c in enumerate(text):
        k = _kind(c)
        nxt = _kind(text[i + 1]) if i + 1 < len(text) else None
        cur = text[start:i] if start >= 0 else ""
        if cur and (
            k == "m"
            or (kind == "w" and k == "w")
            or (c in _JOINERS and nxt == kind)  # joins the next character to this token
            or cur[-1] in _JOINERS
            or (kind == "w" and c == "'" and "'" not in cur and nxt == "w")
            or (kind == "s" and (ord(c) in _MODIFIERS or ord(c) in _TAGS))
            or (len(cur) == 1 and ord(cur) in _REGIONAL and ord(c) in _REGIONAL)
        ):
            continue
        if cur:
            out.append((start, i))
        start, kind = (i, "s" if k == "m" else k) if k is not None else (-1, None)
    if start >= 0 and start < len(text):
        out.append((start, len(text)))
    return out


class WordTokenizer:
    """Lower-cases, splits on whitespace and punctuation (dropped), maps words to ids.

    ``tokenizer(texts)`` returns ``(ids, tokens)``: ``ids`` is an int64 [N, L] tensor padded
    with ``PAD_ID`` (0) to the longest text in the batch (L >= 1); ``tokens[i]`` lists the
    words of text i, so ``tokens[i][j]`` is the word at ``ids[i, j]`` and positions
    ``j >= len(tokens[i])`` are padding. Out-of-vocabulary words, and characters that are
    neither white space nor punctuation (``ñ``, an emoji), keep their spelling in ``tokens``
    and get ``UNK_ID`` (1) in ``ids`` (``split_words``); a text of punctuation alone has no
    token.
    """

    def __init__(self, vocab: Sequence[str] = VOCAB, max_length: int | None = None) -> None:
        self.vocab = tuple(vocab)
        self.index = {w: i for i, w in enumerate(self.vocab)}
        self.max_length = max_length

    def split(self, text: str) -> list[str]:
        words = split_words(text)
        return words if self.max_length is None else words[: self.max_length]

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int] | None]]:
        """Each token's characters in its text (``tokenizer(texts)``'s tokens, in order)."""
        spans = [word_offsets(t) for t in texts]
        if self.max_length is not None:
            spans = [s[: self.max_length] for s in spans]
        return [list(s) for s in spans]

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, list[list[str]]]:
        if isinstance(texts, str):  # a bare string would be split into characters
            raise TypeError("texts must be a sequence of strings, not a single string")
        tokens = [self.split(t) for t in texts]
        length = max([1, *(len(t) for t in tokens)])
        ids = torch.full((len(tokens), length), PAD_ID, dtype=torch.long)
        for i, words in enumerate(tokens):
            if words:
                ids[i, : len(words)] = torch.tensor([self.index.get(w, UNK_ID) for w in words])
        return ids, tokens


class TextClassifier(nn.Module):
    """Embedding -> masked mean over non-pad tokens -> Linear -> ReLU -> Linear."""

    def __init__(self, vocab_size: int = len(VOCAB), dim: int = EMBED_DIM) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=PAD_ID)
        self.fc1 = nn.Linear(dim, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(16, len(LABELS))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # The mask comes from the ids, not the embeddings, so layer methods that replace the
        # embedding output (layer integrated gradients) still average over the same tokens.
        mask = (ids != PAD_ID).unsqueeze(-1).to(self.embedding.weight.dtype)
        emb = self.embedding(ids)
        pooled = (emb * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.fc2(self.relu(self.fc1(pooled)))


def make_data(
    n: int, generator: torch.Generator, max_len: int = 12
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` padded id rows [n, max_len] and their polarity classes [n].

    Each row has 3..max_len tokens: neutral filler (about 5% of it unknown words) with one or
    two sentiment words of the row's polarity at random positions.
    """
    n_neg, n_pos, n_neu = len(NEGATIVE), len(POSITIVE), len(NEUTRAL)
    first_neg, first_pos = 2, 2 + n_neg
    first_neu = first_pos + n_pos
    y = torch.randint(0, 2, (n,), generator=generator)
    lengths = torch.randint(3, max_len + 1, (n,), generator=generator)
    ids = first_neu + torch.randint(0, n_neu, (n, max_len), generator=generator)
    # some filler is out-of-vocabulary, so the UNK embedding learns to be neutral too
    ids[torch.rand(n, max_len, generator=generator) < 0.05] = UNK_ID
    ids[torch.arange(max_len).expand(n, max_len) >= lengths[:, None]] = PAD_ID
    n_sent = torch.randint(1, 3, (n,), generator=generator)
    for k in range(2):
        pos = (torch.rand(n, generator=generator) * lengths).long()
        word = torch.randint(0, n_neg, (n,), generator=generator)
        sentiment = torch.where(y == 1, first_pos + word % n_pos, first_neg + word)
        rows = torch.nonzero(n_sent > k).squeeze(1)
        ids[rows, pos[rows]] = sentiment[rows]
    return ids, y
