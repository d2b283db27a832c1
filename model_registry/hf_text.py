"""A Hugging Face text classifier (``AutoModelForSequenceClassification``, a label per text;
``AutoModelForTokenClassification``, a label per token; single texts and text pairs) served as
a tensor model: token ids in, the logits out.

The service's tensor models take one tensor of ids, so the attention mask and the token type
ids travel inside it: positions the batch pads are ``PADDED`` (-1), never a token, and the
wrapper derives the mask from them (and, for models that take token type ids, the second
segment from the first separator). A baseline can therefore hold the pad token at positions
that stay attended, as Captum's LayerIntegratedGradients does with the tokenizer's mask beside
the baseline ids: the default baseline keeps the tokens the tokenizer adds (``[CLS]``,
``[SEP]``) and the batch's padding, and puts the pad token everywhere else.

The tokenizer must be a real one: ``AutoTokenizer`` on a directory without tokenizer files
gives one that knows only its special tokens (``real_tokenizer``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from methods.engine.hierarchy import text_tree

#: the id at positions a batch pads (never a token id)
PADDED = -1
#: the Auto classes the directory is loaded with: a label per text, or per token
AUTO_CLASS = "AutoModelForSequenceClassification"
TOKEN_AUTO_CLASS = "AutoModelForTokenClassification"
#: extractive question answering (``model_registry.hf_qa``)
QA_AUTO_CLASS = "AutoModelForQuestionAnswering"

Text = str | tuple[str, str]


class TextClassifier(nn.Module):
    """``model(input_ids, attention_mask[, token_type_ids]).logits`` from one tensor of ids
    (``PADDED`` where the batch pads)."""

    def __init__(self, model: nn.Module, pad_id: int, sep_id: int | None, types: bool) -> None:
        super().__init__()
        self.model = model
        self.pad_id, self.sep_id, self.types = pad_id, sep_id, types

    def encoded(self, ids: torch.Tensor) -> dict[str, Any]:
        """The model's keyword inputs for ``ids``: the ids (the pad token where the batch
        pads), the attention mask and, where it takes them, the token type ids."""
        padded = ids == PADDED
        kw: dict[str, Any] = {
            "input_ids": ids.masked_fill(padded, self.pad_id),
            "attention_mask": (~padded).long(),
        }
        if self.types and self.sep_id is not None:
            sep = (ids == self.sep_id).long()
            kw["token_type_ids"] = ((sep.cumsum(1) - sep) > 0).long().masked_fill(padded, 0)
        return kw

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(**self.encoded(ids)).logits


class Tokenize:
    """Texts (or pairs of texts) as one batch of ids, ``PADDED`` after each row's end, and the
    tokens the model sees; a text longer than the model's positions is refused (ValueError
    naming its index), never truncated."""

    #: the service sends pairs of texts to tokenizers that say they take them
    pairs = True
    #: token ids sent instead of texts may mark padding with it
    padded = PADDED

    def __init__(self, tokenizer: Any, positions: int, pad_id: int) -> None:
        self.tokenizer, self.positions, self.pad_id = tokenizer, positions, pad_id
        # the tokens the tokenizer adds around texts and pairs ([CLS], [SEP]; not [UNK])
        added = [*tokenizer("")["input_ids"], *tokenizer("", "")["input_ids"]]
        self.special = sorted(set(added))

    def __call__(self, texts: Sequence[Text]) -> tuple[torch.Tensor, list[list[str]]]:
        rows = []
        for i, text in enumerate(texts):
            pair = (text[0], text[1]) if isinstance(text, (tuple, list)) else (text, None)
            ids = self.tokenizer(*pair, truncation=False)["input_ids"]
            if len(ids) > self.positions:
                raise ValueError(
                    f"text {i} is {len(ids)} tokens long; the model takes at most "
                    f"{self.positions} positions (texts are never truncated)"
                )
            rows.append(ids)
        width = max((len(r) for r in rows), default=0)
        batch = torch.full((len(rows), width), PADDED, dtype=torch.int64)
        for r, ids in enumerate(rows):
            batch[r, : len(ids)] = torch.tensor(ids, dtype=torch.int64)
        return batch, [list(self.tokenizer.convert_ids_to_tokens(r)) for r in rows]

    def offsets(self, texts: Sequence[str]) -> list[list[tuple[int, int] | None]]:
        """Each token's characters in its text (None for the tokens the tokenizer adds), as
        a fast tokenizer's offset mapping gives them; ValueError for a tokenizer without one."""
        out = []
        for text in texts:
            try:
                data = self.tokenizer(
                    text,
                    truncation=False,
                    return_offsets_mapping=True,
                    return_special_tokens_mask=True,
                )
            except NotImplementedError:
                raise ValueError(
                    "the model's tokenizer gives no character offsets (a slow, Python "
                    "tokenizer): units need a fast one (tokenizer.json)"
                ) from None
            pairs = zip(data["offset_mapping"], data["special_tokens_mask"], strict=True)
            out.append([None if special else (int(a), int(b)) for (a, b), special in pairs])
        return out

    def baseline(self, ids: torch.Tensor, fill: int | None = None) -> torch.Tensor:
        """The tokens the tokenizer adds and the batch's padding kept, ``fill`` (default:
        the pad token) elsewhere."""
        keep = ids == PADDED
        for s in self.special:
            keep |= ids == s
        token = self.pad_id if fill is None else fill
        return torch.where(keep, ids, torch.full_like(ids, token))

    def masked(self, ids: torch.Tensor) -> torch.Tensor | None:
        """``baseline`` with the tokenizer's mask token (``[MASK]``) where it has one: what
        shap's ``Text`` masker puts in place of hidden tokens (None: no mask token)."""
        mask = getattr(self.tokenizer, "mask_token_id", None)
        return None if mask is None else self.baseline(ids, int(mask))


def real_tokenizer(tokenizer: Any, vocab_size: int) -> str | None:
    """Why ``tokenizer`` is not the model's (None: it is): a directory without tokenizer files
    gives one holding only its special tokens."""
    size = len(tokenizer)
    specials = len(set(tokenizer.all_special_ids))
    if size <= specials:
        return (
            f"the directory has no tokenizer files (AutoTokenizer found only its {size} special "
            "tokens); save the tokenizer beside the model (tokenizer.save_pretrained(DIR))"
        )
    if size > vocab_size:
        return (
            f"its tokenizer has {size} tokens but the model's embedding holds {vocab_size}: "
            "they are not one model's"
        )
    return None


def text_hierarchy(tokenizer: Any, text: str | Sequence[str]) -> np.ndarray:
    """The token tree shap's ``Text`` masker builds for ``text`` (or a pair) from ``tokenizer``
    (``partition``'s default hierarchy for text models): one leaf per token id the tokenizer
    gives, special tokens included, from each token's segment of the text."""
    sep = getattr(tokenizer, "sep_token", None)
    return text_tree(_segments(tokenizer, text), [sep] if isinstance(sep, str) else [])


def _segments(tokenizer: Any, text: str | Sequence[str]) -> list[str]:
    """Each token's text up to the next token's (shap's ``Text.token_segments``): from the
    offsets of a fast tokenizer for a single text; else from the tokens, special ones blank,
    word pieces glued and words spaced."""
    if isinstance(text, str):
        try:
            data = tokenizer(text, return_offsets_mapping=True, truncation=False)
            offsets = [(0, 0) if o is None else o for o in data["offset_mapping"]]
        except (NotImplementedError, TypeError, ValueError, KeyError):
            offsets = None
        if offsets:
            parts = [
                text[offsets[i][0] : max(offsets[i][1], offsets[i + 1][0])]
                for i in range(len(offsets) - 1)
            ]
            return [*parts, text[offsets[-1][0] : offsets[-1][1]]]
    pair = (text, None) if isinstance(text, str) else (text[0], text[1])
    ids = tokenizer(*pair, truncation=False)["input_ids"]
    tokens = list(tokenizer.convert_ids_to_tokens(ids))
    keep = {getattr(tokenizer, "sep_token", None), getattr(tokenizer, "mask_token", None)}
    special = tokenizer.get_special_tokens_mask(ids, already_has_special_tokens=True)
    for i, v in enumerate(special):
        if v == 1 and (tokens[i] not in keep or i + 1 == len(special)):
            tokens[i] = ""
    for i, v in enumerate(tokens):
        if v.startswith("##"):
            tokens[i] = v[2:]
        elif v != "" and i != 0:
            tokens[i] = " " + v
    return tokens
