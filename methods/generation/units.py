"""A text cut into units (sentences, paragraphs, pieces between a pattern's matches), each
with the text that separates it from the one before, so any subset of the units joins back into
a text the way the whole did (ContextCite's partitioner: a kept unit is preceded by its own
separator, except the first kept one).

Sentences end after ``.``, ``!`` or ``?`` (and any closing quotes or brackets) followed by white
space or the end of a line, except after a few common abbreviations ("Dr.", "e.g.") and single
capitals ("J. Smith"); a line break always ends one. This is Punkt's behaviour without its
trained statistics, which ship as separate data (NLTK's ``punkt_tab``) and are not needed for
the usual well-punctuated context.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from methods.errors import InvalidArgumentError

KINDS = ("sentences", "paragraphs", "documents")
#: a sentence's end: its punctuation and closing marks, before white space or the line's end
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s|$)")
_ABBREVIATIONS = frozenset(
    ("mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "cf", "al",
     "fig", "no", "vol", "approx", "dept", "est", "inc", "ltd", "co")
)  # fmt: skip
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")
#: documents given as a list are joined with this (a paragraph break)
DOCUMENT_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Units:
    """The units of a text and what precedes each (``separators[0]``: the text's lead)."""

    parts: tuple[str, ...]
    separators: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.parts)

    def join(self, keep: list[bool] | tuple[bool, ...] | None = None) -> str:
        """The text of the kept units (all when ``keep`` is None)."""
        out: list[str] = []
        for i, (sep, part) in enumerate(zip(self.separators, self.parts, strict=True)):
            if keep is None or keep[i]:
                out.append(part if not out else sep + part)
        return "".join(out)


def _from_spans(text: str, spans: list[tuple[int, int]]) -> Units:
    parts, seps, prev = [], [], 0
    for a, b in spans:
        parts.append(text[a:b])
        seps.append(text[prev:a])
        prev = b
    return Units(tuple(parts), tuple(seps))


def _stripped(text: str, a: int, b: int) -> tuple[int, int] | None:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return (a, b) if a < b else None


def _abbreviation(text: str, end: int) -> bool:
    """Whether the period ending at ``end`` closes an abbreviation, not a sentence."""
    word = re.search(r"(\S+)\.$", text[:end])
    if word is None:
        return False
    w = word.group(1).lower().lstrip("(\"'")
    return w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha())


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the text's sentences (white space around them left out)."""
    spans: list[tuple[int, int]] = []
    for line in re.finditer(r"[^\n]+", text):
        a = line.start()
        for m in _END.finditer(text, line.start(), line.end()):
            if m.group().startswith(".") and len(m.group()) == 1 and _abbreviation(text, m.end()):
                continue
            span = _stripped(text, a, m.end())
            if span is not None:
                spans.append(span)
            a = m.end()
        span = _stripped(text, a, line.end())
        if span is not None:
            spans.append(span)
    return spans


def sentences(text: str) -> list[str]:
    """The text's sentences (``sentence_spans``)."""
    return [text[a:b] for a, b in sentence_spans(text)]


def _pieces(text: str, pattern: re.Pattern[str]) -> list[tuple[int, int]]:
    spans, prev = [], 0
    for m in pattern.finditer(text):
        span = _stripped(text, prev, m.start())
        if span is not None:
            spans.append(span)
        prev = max(m.end(), prev)
    span = _stripped(text, prev, len(text))
    if span is not None:
        spans.append(span)
    return spans


def split(
    context: str | list[str],
    units: str = "sentences",
    pattern: str | None = None,
    *,
    argument: str = "context",
) -> Units:
    """The context's units: its sentences, paragraphs, documents (each text of a list), or the
    pieces between matches of ``pattern`` (a regular expression). A list of documents is first
    joined with paragraph breaks, so no unit spans two documents."""
    if isinstance(context, str):
        docs = [context]
    elif isinstance(context, list) and all(isinstance(d, str) for d in context):
        docs = list(context)
    else:
        raise InvalidArgumentError(
            "context must be a text or a list of texts (documents)", argument=argument
        )
    if not any(d.strip() for d in docs):
        raise InvalidArgumentError(
            "the context is empty: nothing to attribute to", argument=argument
        )
    if pattern is not None:
        try:
            rx = re.compile(pattern)
        except (re.error, TypeError) as exc:
            raise InvalidArgumentError(
                f"unit_pattern is not a regular expression: {exc}", argument="unit_pattern"
            ) from None
        if rx.fullmatch("") is not None:
            raise InvalidArgumentError(
                "unit_pattern matches the empty text; it must match the separators between "
                'units (e.g. "\\n" or "; ")',
                argument="unit_pattern",
            )
        text = DOCUMENT_SEPARATOR.join(docs)
        return _from_spans(text, _pieces(text, rx))
    if units not in KINDS:
        raise InvalidArgumentError(
            f"units must be one of {list(KINDS)}, got {units!r}", argument="units"
        )
    if units == "documents":
        kept = [d for d in docs if d.strip()]
        seps = ("",) + (DOCUMENT_SEPARATOR,) * (len(kept) - 1)
        return Units(tuple(kept), seps)
    text = DOCUMENT_SEPARATOR.join(docs)
    if units == "paragraphs":
        return _from_spans(text, _pieces(text, _PARAGRAPH_BREAK))
    return _from_spans(text, sentence_spans(text))


#: the units ``text_spans`` cuts a text into (a classifier's ``units``)
TEXT_UNITS = ("word", "sentence", "paragraph")
_WORD = re.compile(r"\S+")


def text_spans(text: str, unit: str) -> list[tuple[int, int]]:
    """Character spans of ``text``'s units: words (runs of characters that are not white
    space, as a predictor sent words splits them), sentences (``sentence_spans``) or
    paragraphs (blocks between blank lines), white space around them left out."""
    if unit == "word":
        return [m.span() for m in _WORD.finditer(text)]
    if unit == "sentence":
        return sentence_spans(text)
    if unit == "paragraph":
        return _pieces(text, _PARAGRAPH_BREAK)
    raise InvalidArgumentError(
        f"units must be one of token, {', '.join(TEXT_UNITS)}; got {unit!r}", argument="units"
    )
