"""Request and response schemas of a model's concept sets and ``POST .../tcav`` (CONTRACT
7.1): the example inputs take the attributions route's forms."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from service.wire.schemas import Inputs, Target

#: a concept's name: a file name on every system, never a path
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAME_RULE = "1-64 characters of A-Z a-z 0-9 _ . -, starting with a letter or digit"


def valid_name(name: str) -> bool:
    return NAME.fullmatch(name) is not None and name not in (".", "..")


def read_set(path: str) -> tuple[dict[str, Any], tuple[np.ndarray, ...], tuple[Any, ...]]:
    """A stored set's file (``service.concepts.serving``): its description, its arrays (one
    per model input) and its texts (pairs as tuples)."""
    with np.load(path, allow_pickle=False) as f:
        meta: dict[str, Any] = json.loads(str(f["meta"]))
        texts = json.loads(str(f["texts"]))
        arrays = tuple(f[f"x{i}"] for i in range(len(meta["shape"] or [])))
    return meta, arrays, tuple(t if isinstance(t, str) else (t[0], t[1]) for t in texts)


class ConceptPut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Inputs = Field(
        description="the concept's examples, in any form the attributions route takes"
    )


class ConceptInfo(BaseModel):
    name: str
    n: int = Field(description="examples in the set")
    shape: list[list[int]] | None = Field(
        description="each input's shape per example (raw texts: null)"
    )
    updated: str = Field(description="when the set was last written (ISO 8601, UTC)")
    digest: str = Field(description="sha256 of the set's contents (what CAVs are cached by)")


class ConceptSet(ConceptInfo):
    inputs: Any = Field(description="the stored examples: one tensor per input, or the texts")


class ConceptList(BaseModel):
    concepts: list[ConceptInfo]


class TCAVParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    classifier: Literal["logistic", "linear_svm"] = Field(
        "logistic",
        description="the linear classifier of each CAV: L2-regularised logistic regression "
        "(scikit-learn's LogisticRegression(C=1) objective) or a squared-hinge linear SVM",
    )
    alpha: float = Field(0.05, gt=0, lt=1, description="significance level of the t-test")
    seed: int | None = Field(
        None, description="picks each CAV's held-out examples (null: 0, so answers repeat)"
    )


class TCAVRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Inputs = Field(description="the examples whose prediction is explained")
    target: Target = Field(
        None,
        description="the output explained: a class index or label per request or per example, "
        '"predicted", or null on one-output models',
    )
    concepts: list[str] = Field(min_length=1, max_length=32, description="concept set names")
    random_concepts: list[str] = Field(
        min_length=2,
        max_length=32,
        description="random set names (at least 2): CAVs against each, and the random sets "
        "against each other as the null distribution",
    )
    layers: list[str] | None = Field(
        None,
        min_length=1,
        max_length=16,
        description="dotted module paths (default: the model's listed layers)",
    )
    params: TCAVParams = Field(
        default_factory=lambda: TCAVParams(classifier="logistic", alpha=0.05, seed=None)
    )
    deadline_ms: float | None = Field(None, gt=0, description="deadline in ms")


class TCAVRow(BaseModel):
    concept: str
    layer: str
    sign_count: float = Field(description="share of inputs with g . cav > 0, mean over randoms")
    magnitude: float = Field(
        description="sum |g . cav| [g . cav > 0] / sum |g . cav|, mean over random sets"
    )
    sign_counts: list[float] = Field(description="one per random set, in the request's order")
    p_value: float | None = Field(
        description="pooled two-sided t-test against random-vs-random sign counts (null: "
        "both constant and equal)"
    )
    random_sign_count: float = Field(
        description="the sign count of the random sets against each other (mean): what chance "
        "gives, the baseline the concept's is tested against"
    )
    significant: bool = Field(description="p_value < alpha")
    verdict: Literal["for", "against", "not significant"] = Field(
        description='in words: significant and above the random sets\' sign count ("for": the '
        'concept raises the target), significant and below it ("against": it lowers the '
        'target), or "not significant"'
    )
    cav_accuracy: float = Field(description="the CAVs' held-out accuracy, mean over randoms")


class TCAVResponse(BaseModel):
    model_id: str
    model_version: str
    scores: list[TCAVRow]
    computed: int = Field(
        description="layer activations of a set and CAVs this query computed; the rest came "
        "from the cache (0: all of it)"
    )
    timing_ms: dict[str, float]
