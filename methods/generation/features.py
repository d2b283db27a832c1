"""Prompt features: what is switched on and off, and the token ids of each perturbed prompt.

Captum's two interpretable text inputs, same semantics:

- ``TokenFeatures`` (``TextTokenInput``): the prompt is tokenized once (special tokens
  included); every token not in ``skip_tokens`` is a feature; an absent feature becomes the
  baseline token (an id, or a token string; default id 0). Every perturbed prompt has the
  prompt's length.
- ``TemplateFeatures`` (``TextTemplateInput``): a ``str.format`` template whose slots are the
  features (``{}`` with a list of values, ``{name}`` with a dict); an absent slot takes its
  baseline string (default ``""``), and the completed text is tokenized whole, so features
  may change the length, and tokens merge across slot boundaries exactly as the tokenizer
  merges them.

A feature is present where its entry of the 0/1 vector is 1 (Captum: ``!= 1`` is absent).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

from methods.cancel import checkpoint
from methods.errors import InvalidArgumentError, InvalidTypeError
from methods.generation.errors import EmptyPromptError, TemplateMismatchError


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer the engine uses (tiny-lm's has the same)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Any) -> str: ...

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]: ...

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]: ...


def encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    if isinstance(ids, Tensor):
        ids = ids.reshape(-1).tolist()
    return [int(i) for i in ids]


class Features:
    """A prompt's features; ``ids(masks)`` gives each perturbed prompt's token ids."""

    #: one label per feature (Captum's ``values``: tokens, or the slot values)
    labels: list[str]

    @property
    def n(self) -> int:
        return len(self.labels)

    def ids(self, present: Tensor) -> list[tuple[int, ...]]:
        """Token ids of the prompts with features ``present`` [B, F] (bool) switched on."""
        raise NotImplementedError

    def prompt_ids(self) -> tuple[int, ...]:
        """The unperturbed prompt's ids."""
        return self.ids(torch.ones(1, self.n, dtype=torch.bool))[0]


class TokenFeatures(Features):
    def __init__(
        self, tokenizer: Any, prompt: str, baselines: Any = None, skip_tokens: Any = None
    ) -> None:
        self.base = encode(tokenizer, prompt)
        skip = _skip_ids(tokenizer, skip_tokens)
        self.positions = [i for i, t in enumerate(self.base) if t not in skip]
        if not self.positions:
            raise EmptyPromptError(
                f"the prompt {prompt!r} has no token left to attribute to "
                f"({len(self.base)} tokens, all in skip_tokens)",
                argument="prompt",
            )
        self.baseline = _baseline_id(tokenizer, baselines)
        self.labels = list(tokenizer.convert_ids_to_tokens([self.base[i] for i in self.positions]))
        self._base = torch.tensor(self.base, dtype=torch.long)
        self._pos = torch.tensor(self.positions, dtype=torch.long)

    def id_rows(self, present: Tensor) -> Tensor:
        """[B, L] ids (every perturbed prompt has the prompt's length)."""
        rows = self._base.to(present.device).expand(int(present.shape[0]), -1).clone()
        pos = self._pos.to(present.device)
        rows[:, pos] = torch.where(
            present, rows[:, pos], torch.full_like(rows[:, pos], self.baseline)
        )
        return rows

    def ids(self, present: Tensor) -> list[tuple[int, ...]]:
        return [tuple(r) for r in self.id_rows(present.cpu()).tolist()]


def _skip_ids(tokenizer: Any, skip_tokens: Any) -> set[int]:
    if skip_tokens is None:
        return set()
    if isinstance(skip_tokens, (str, int)) or not isinstance(skip_tokens, Sequence):
        raise InvalidTypeError(
            f"skip_tokens must be a list of token ids or token strings, got {skip_tokens!r}",
            argument="skip_tokens",
        )
    items = list(skip_tokens)
    if all(isinstance(t, str) for t in items):
        return {int(i) for i in tokenizer.convert_tokens_to_ids(items)}
    if all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return set(items)
    raise InvalidTypeError(
        "skip_tokens must be all token ids or all token strings", argument="skip_tokens"
    )


def _baseline_id(tokenizer: Any, baselines: Any) -> int:
    if baselines is None:
        return 0  # Captum's default (commonly the unknown token)
    if isinstance(baselines, bool):
        raise InvalidTypeError(
            "baselines must be a token id or a token string", argument="baselines"
        )
    if isinstance(baselines, int):
        return baselines
    if isinstance(baselines, str):
        found = tokenizer.convert_tokens_to_ids([baselines])[0]
        if found is None:
            raise InvalidArgumentError(
                f"baseline token {baselines!r} is not in the tokenizer's vocabulary",
                argument="baselines",
            )
        return int(found)
    raise InvalidTypeError(
        "for a prompt without template slots, baselines is one token (an id or a token "
        f"string) that stands for absent tokens; got {type(baselines).__name__}",
        argument="baselines",
    )


class TemplateFeatures(Features):
    def __init__(self, tokenizer: Any, template: str, values: Any, baselines: Any = None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        named = isinstance(values, Mapping)
        if not named and (isinstance(values, str) or not isinstance(values, Sequence)):
            raise InvalidTypeError(
                f"features must be a list of slot values (or a dict for named slots), got "
                f"{type(values).__name__}",
                argument="features",
            )
        slots = _slots(template)
        self.keys: list[str] = []
        if named:
            self.keys = [str(k) for k in values]
            vals = [values[k] for k in values]
            if sorted(set(slots)) != sorted(self.keys) or "" in slots:
                raise TemplateMismatchError(
                    f"the template's slots {slots} do not match the features' names "
                    f"{self.keys}; a dict of features fills named slots ({{name}})",
                    argument="features",
                )
        else:
            vals = list(values)
            if any(s != "" for s in slots) or len(slots) != len(vals):
                raise TemplateMismatchError(
                    f"the template has {len(slots)} slot(s) "
                    f"{['{' + s + '}' for s in slots]} but {len(vals)} feature value(s) were "
                    "given; give one value per {} slot (or a dict for named slots)",
                    argument="features",
                )
        if not vals:
            raise EmptyPromptError("there are no features to attribute to", argument="features")
        for i, v in enumerate(vals):
            if not isinstance(v, str):
                raise InvalidTypeError(
                    f"feature {i} must be a string, got {type(v).__name__}", argument="features"
                )
        self.values: list[str] = vals
        self.labels = list(vals)
        self.baselines = self._baselines(baselines, named)
        if not template.strip() and not any(v.strip() for v in vals):
            raise EmptyPromptError("the prompt is empty", argument="prompt")
        self._memo: dict[tuple[bool, ...], tuple[int, ...]] = {}

    def _baselines(self, baselines: Any, named: bool) -> list[str]:
        n = len(self.values)
        if baselines is None:
            return [""] * n
        if named:
            if not isinstance(baselines, Mapping) or sorted(map(str, baselines)) != sorted(
                self.keys
            ):
                raise TemplateMismatchError(
                    f"with named features, baselines must be a dict with the same names "
                    f"{self.keys}",
                    argument="baselines",
                )
            out = [baselines[k] for k in self.keys]
        else:
            if isinstance(baselines, str) or not isinstance(baselines, Sequence):
                raise InvalidTypeError(
                    f"baselines must be a list of {n} strings (one per slot), got "
                    f"{type(baselines).__name__}",
                    argument="baselines",
                )
            out = list(baselines)
            if len(out) != n:
                raise TemplateMismatchError(
                    f"{len(out)} baseline(s) for {n} feature(s); give one per slot",
                    argument="baselines",
                )
        if not all(isinstance(b, str) for b in out):
            raise InvalidTypeError("every baseline must be a string", argument="baselines")
        return out

    def text(self, present: Sequence[bool]) -> str:
        vals = [
            v if on else b for v, b, on in zip(self.values, self.baselines, present, strict=True)
        ]
        if self.keys:
            return self.template.format(**dict(zip(self.keys, vals, strict=True)))
        return self.template.format(*vals)

    def ids(self, present: Tensor) -> list[tuple[int, ...]]:
        out = []
        for i, row in enumerate(present.cpu().tolist()):
            if i % 256 == 255:
                checkpoint()  # thousands of texts to tokenize: a cancelled request stops here
            key = tuple(bool(x) for x in row)
            found = self._memo.get(key)
            if found is None:
                found = self._memo[key] = tuple(encode(self.tokenizer, self.text(key)))
            out.append(found)
        return out


def _slots(template: str) -> list[str]:
    """The template's replacement fields, in order ("" for a positional {})."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise TemplateMismatchError(
            f"the template is not a valid format string: {e}", argument="prompt"
        ) from None
    slots = []
    for _, field, spec, _conv in parsed:
        if field is None:
            continue
        if field.isdigit() or (spec and "{" in spec):
            raise TemplateMismatchError(
                "template slots are {} (positional, in order) or {name}; numbered or nested "
                f"fields are not supported, got {{{field}}}",
                argument="prompt",
            )
        slots.append(field)
    return slots


def make_features(
    tokenizer: Any, prompt: Any, features: Any, baselines: Any, skip_tokens: Any
) -> Features:
    """Token features (``features`` None) or template slots (Captum's two text inputs)."""
    if not isinstance(prompt, str):
        raise InvalidTypeError(
            f"prompt must be a string, got {type(prompt).__name__}", argument="prompt"
        )
    if not prompt.strip() and not features:
        raise EmptyPromptError("the prompt is empty", argument="prompt")
    if features is None:
        return TokenFeatures(tokenizer, prompt, baselines, skip_tokens)
    if skip_tokens is not None:
        raise InvalidArgumentError(
            "skip_tokens applies to token features (a prompt without features); template "
            "features are the slots",
            argument="skip_tokens",
        )
    return TemplateFeatures(tokenizer, prompt, features, baselines)
