"""Request and response of ``POST /v1/models/{id}/context-attributions`` (CONTRACT 8.3): which
units of the context support each sentence of the answer (``methods.attribute_context``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class GenArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_new_tokens: int = Field(64, ge=1, description="most tokens of the generated answer")


class ContextRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    context: str | list[str] = Field(
        description="the context: one text, or a list of documents (retrieved passages)"
    )
    query: str = Field(description="what the model is asked about the context")
    answer: str | None = Field(
        None, description="the answer to attribute; null: the model's greedy answer"
    )
    units: Literal["sentences", "paragraphs", "documents"] = Field(
        "sentences",
        description="what a unit of the context is: a sentence, a paragraph (text between "
        "blank lines), or a document (each text of a list)",
    )
    unit_pattern: str | None = Field(
        None,
        description="a regular expression matching the separators between units (replaces "
        '"units"), e.g. "\\n" for one unit per line',
    )
    n_ablations: int = Field(
        64, description="random subsets of the units the answer is scored after (at least 8)"
    )
    seed: int = Field(0, ge=0, description="the subsets' seed (context-cite's masks for it)")
    keep_prob: float = Field(0.5, gt=0, lt=1, description="each unit's chance to be kept")
    prompt_template: str | None = Field(
        None,
        description="how the prompt is built, with {context} and {query} once each; default "
        '"{context}\\n\\n{query}", through the model\'s chat template when it has one',
    )
    score: Literal["log_prob", "logit_prob"] = Field(
        "log_prob",
        description="what the surrogate fits per answer sentence: its summed log-probability, "
        "or the log-odds of its probability (ContextCite's default)",
    )
    alpha: float = Field(0.01, gt=0, description="the Lasso surrogate's L1 penalty")
    gen_args: GenArgs | None = Field(
        None, description="when answer is null: greedy decoding of at most max_new_tokens"
    )
    perturbations_per_eval: int | None = Field(
        None, ge=1, description="most ablated prompts per forward (default: memory decides)"
    )
    return_masks: bool = Field(
        False, description="add the ablations' masks (ablations x units, 1 = kept)"
    )
    deadline_ms: float | None = Field(None, gt=0, description="this request's deadline")


class Fit(BaseModel):
    r2: list[float | None] = Field(
        description="per answer sentence, the surrogate's R² on a held-out 20% of the "
        "ablations (fitted on the rest); low or negative: do not trust its ranking. null: the "
        "held-out scores did not vary"
    )


class ContextResponse(BaseModel):
    model_id: str
    model_version: str
    units: list[str] = Field(description="the context's units, in order")
    answer: str = Field(
        description="the answer attributed: exactly as given, or the generated tokens decoded"
    )
    answer_sentences: list[str] = Field(
        description="the answer's sentences, each a substring of answer (see answer_spans)"
    )
    answer_spans: list[Annotated[list[int], Field(min_length=2, max_length=2)]] = Field(
        description="per answer sentence, its [start, end) character offsets in answer"
    )
    scores: list[list[float]] = Field(
        description="per answer sentence, each unit's weight: how much keeping it raises the "
        "sentence's score (0: no effect found)"
    )
    top: list[list[int]] = Field(description="per answer sentence, the units best first")
    fit: Fit
    intercepts: list[float] = Field(
        description="per answer sentence, the surrogate's score with no unit kept"
    )
    masks: list[list[int]] | None = Field(
        None, description="with return_masks: the ablations (ablations x units, 1 = kept)"
    )
    params: dict[str, object] = Field(description="every effective parameter")
    stats: dict[str, int] = Field(description="forwards, prompts and tokens run")
    timing_ms: dict[str, float]
