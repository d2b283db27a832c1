"""What a remote predictor is sent (models.toml ``send``): the input tensors as they are
(``"tensors"``), the text of each row (``"text"``), or each row as an encoded image
(``"png"``, ``"jpeg"``).

A predictor that takes text is explained over its words: a request's texts become word ids
here (``Words``), the perturbation methods drop or mask words as they would tokens, and each
perturbed row is written back as text, word by word, with the text between words kept, before
it is sent. A predictor that takes encoded images is explained over the pixels of a declared
``[C, H, W]`` tensor: each perturbed row is encoded (PNG is lossless; JPEG is not, so its
answers carry the codec's own noise) and sent in base64.
"""

from __future__ import annotations

import base64
import io
import re
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from methods.errors import InvalidArgumentError

SENDS = ("tensors", "text", "png", "jpeg")
#: the id at positions a batch of texts pads (as ``model_registry.hf_text.PADDED``)
PADDED = -1
#: what a word is by default: a run of characters that are not white space
WORDS = r"\S+"
#: distinct (text before, word, text after) pieces a worker keeps before it starts over
MAX_PIECES = 1 << 20


class Words:
    """Texts as one batch of word ids and back, for a predictor that takes text.

    ``tokenizer(texts)`` gives ``(ids, words)`` as every tokenizer the service holds does:
    ``ids`` int64 [N, L], ``PADDED`` after each text's end. An id names a piece of text: a
    word with the text that follows it up to the next word (and, for the first word, what
    precedes it), so the text is rebuilt exactly from its ids. The default baseline of the
    piece ``k`` is ``-k - 1``: the same piece with its word replaced by ``mask`` (``""``
    drops the word and keeps the space and punctuation around it).
    """

    pairs = False
    padded = PADDED

    def __init__(self, pattern: str = WORDS, mask: str = "", limit: int = MAX_PIECES) -> None:
        self.pattern, self.mask, self.limit = re.compile(pattern), mask, limit
        self._ids: dict[tuple[str, str, str], int] = {}
        self._pieces: list[tuple[str, str, str]] = [("", "", "")]  # id 0: never handed out
        self._lock = threading.Lock()

    def split(self, text: str) -> list[tuple[str, str, str]]:
        """The text's pieces: (text before, word, text after), concatenating to the text."""
        spans = [m.span() for m in self.pattern.finditer(text) if m.end() > m.start()]
        pieces = []
        for i, (start, end) in enumerate(spans):
            before = text[:start] if i == 0 else ""
            after = text[end : spans[i + 1][0] if i + 1 < len(spans) else len(text)]
            pieces.append((before, text[start:end], after))
        return pieces

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int] | None]]:
        """Each word's characters in its text (``tokenizer(texts)``'s words, in order)."""
        return [[m.span() for m in self.pattern.finditer(t) if m.end() > m.start()] for t in texts]

    def __call__(self, texts: Sequence[str]) -> tuple[torch.Tensor, list[list[str]]]:
        if isinstance(texts, str):
            raise TypeError("texts must be a sequence of strings, not a single string")
        split = [self.split(t) for t in texts]
        for i, pieces in enumerate(split):
            if not pieces:
                what = self.pattern.pattern
                raise ValueError(f"text {i} has no words (a word is what {what!r} matches)")
        with self._lock:
            if len(self._pieces) + sum(map(len, split)) > self.limit:
                # a worker that has seen a million distinct pieces starts over: the ids of
                # this call are the only ones still in use (one request at a time)
                self._ids.clear()
                del self._pieces[1:]
            rows = [[self._intern(p) for p in pieces] for pieces in split]
        width = max(len(r) for r in rows) if rows else 0
        ids = torch.full((len(rows), width), PADDED, dtype=torch.int64)
        for r, row in enumerate(rows):
            ids[r, : len(row)] = torch.tensor(row, dtype=torch.int64)
        return ids, [[word for _, word, _ in pieces] for pieces in split]

    def _intern(self, piece: tuple[str, str, str]) -> int:
        found = self._ids.get(piece)
        if found is None:
            found = self._ids[piece] = len(self._pieces)
            self._pieces.append(piece)
        return found

    def baseline(self, ids: torch.Tensor) -> torch.Tensor:
        """Every word masked (``mask``), the text around it and the padding kept."""
        return torch.where(ids > 0, -ids - 1, ids)

    def texts(self, ids: torch.Tensor) -> list[str]:
        """Each row's text: a piece's id gives the piece, its baseline the piece with its
        word masked, ``PADDED`` nothing."""
        out = []
        with self._lock:
            known = len(self._pieces)
            for row in ids.tolist():
                parts = []
                for i in row:
                    if i == PADDED:
                        continue
                    k = i if i > 0 else -i - 1  # a piece, or its baseline
                    if not 0 < k < known:
                        raise InvalidArgumentError(
                            f"word id {i} names no word of this request: a model that "
                            "takes text is sent texts, not ids (baselines: leave them out, "
                            "and each word is masked)",
                            argument="inputs",
                        )
                    before, word, after = self._pieces[k]
                    parts.append(before + (word if i > 0 else self.mask) + after)
                out.append("".join(parts))
        return out


def encode_images(x: torch.Tensor, fmt: str, pixel_max: float) -> list[str]:
    """Each row of ``x`` ([N, C, H, W] with C 1 or 3, values 0..``pixel_max``) as a base64
    image file: the values scaled to 0..255, rounded and clipped."""
    from PIL import Image

    if x.dim() != 4 or x.shape[1] not in (1, 3):
        raise InvalidArgumentError(
            f"a predictor that takes images is sent [N, C, H, W] tensors with 1 or 3 "
            f"channels; this one is {list(x.shape)}",
            argument="inputs",
        )
    scaled = x.detach().to("cpu", torch.float64).numpy() * (255.0 / pixel_max)
    pixels = np.clip(np.rint(scaled), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    out = []
    for row in pixels:
        picture = Image.fromarray(row[..., 0] if row.shape[-1] == 1 else row)
        buf = io.BytesIO()
        picture.save(buf, format=fmt.upper(), **({"quality": 95} if fmt == "jpeg" else {}))
        out.append(base64.b64encode(buf.getvalue()).decode("ascii"))
    return out


# -- JSON pointers (RFC 6901) ---------------------------------------------------------------


def _tokens(pointer: str) -> list[str]:
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"a JSON pointer starts with '/', got {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def pointer_get(doc: Any, pointer: str) -> Any:
    for t in _tokens(pointer):
        doc = doc[int(t)] if isinstance(doc, list) else doc[t]
    return doc


def pointer_put(doc: Any, pointer: str, value: Any) -> Any:
    tokens = _tokens(pointer)
    if not tokens:
        return value
    at = doc
    for t in tokens[:-1]:
        at = at.setdefault(t, {}) if isinstance(at, dict) else at[int(t)]
    if isinstance(at, list):
        at[int(tokens[-1])] = value
    else:
        at[tokens[-1]] = value
    return doc
