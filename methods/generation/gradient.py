"""Gradient methods on a generated answer: at the token embedding, per target token.

Captum's ``LLMGradientAttribution`` runs the layer method once per target token ``t`` on
prompt + the first ``t`` target tokens, objective ``log_softmax(last logits)[target_t]`` (here:
any ``targets`` function of the step's logits), and
sums the embedding-layer attributions over the embedding dim. Here one call does every target
token: the examples are the T target tokens (example ``t`` selects output ``t``), and each
forward runs prompt + whole target once; causal attention makes output ``t`` depend on the
prompt and the first ``t`` target tokens only, so the numbers are Captum's to rounding. The
target tokens' own embedding rows are the same in the inputs and the baselines, so they get
no attribution and are dropped, as Captum drops them.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import ValidationError
from torch import Tensor, nn

from methods import registry
from methods.api import attribute
from methods.cost import CostShape
from methods.engine.batching import at_most
from methods.errors import InvalidArgumentError
from methods.generation.catalog import check_length, counterpart
from methods.generation.errors import UnsupportedGenerationMethodError
from methods.generation.features import TokenFeatures
from methods.generation.lm import LanguageModel, Seq2SeqLanguageModel
from methods.generation.targets import Objective, StepFn


class _TargetScores(nn.Module):
    """feature presence [B, F] -> each step's value [B, T] of ``answer`` (a ``targets`` step
    function of the step's logits: by default its log-probability). The caller's model is
    the submodule ``lm``, so its embedding is the layer ``lm.<path>``."""

    def __init__(self, lm: LanguageModel, feats: TokenFeatures, answer: Tensor, fn: StepFn) -> None:
        super().__init__()
        self.lm = lm.module
        self.adapter, self.feats, self.answer, self.fn = lm, feats, answer, fn
        self.n = len(feats.base)

    def forward(self, present: Tensor) -> Tensor:
        prompt = self.feats.id_rows(present == 1)
        answer = self.answer.to(prompt.device)
        b, t = int(prompt.shape[0]), int(answer.numel())
        ids = torch.cat([prompt, answer.expand(b, t)], dim=1).to(self.adapter.device)
        logits = self.adapter.logits(ids, keep_from=self.n - 1)[:, :t]
        return self.fn(logits, answer.to(logits.device))


class _ScaledEmbedding(nn.Module):
    """The encoder's token embeddings as the encoder uses them (times its scale): the layer a
    gradient method attaches to on an encoder-decoder. Its own module, so that the decoder's
    calls of the shared embedding are not attributed."""

    def __init__(self, embedding: nn.Module, scale: float) -> None:
        super().__init__()
        self.embedding, self.scale = embedding, scale

    def forward(self, ids: Tensor) -> Tensor:
        out: Tensor = self.embedding(ids) * self.scale
        return out


class _SourceScores(nn.Module):
    """An encoder-decoder's ``_TargetScores``: presence -> source ids -> scaled embeddings
    (``source_embed``, the attributed layer) -> the model with ``inputs_embeds`` -> each
    target step's value [B, T]."""

    def __init__(
        self, lm: Seq2SeqLanguageModel, feats: TokenFeatures, answer: Tensor, fn: StepFn
    ) -> None:
        super().__init__()
        self.source_embed = _ScaledEmbedding(lm.model.get_input_embeddings(), lm.embed_scale)
        self.adapter, self.feats, self.answer, self.fn = lm, feats, answer, fn

    def forward(self, present: Tensor) -> Tensor:
        ids = self.feats.id_rows(present == 1).to(self.adapter.device)
        prompts = [tuple(int(i) for i in row) for row in ids.tolist()]
        embeds = self.source_embed(ids)
        logits = self.adapter.target_logits(prompts, self.answer, embeds=embeds)
        return self.fn(logits, self.answer.to(logits.device))


def run(
    lm: LanguageModel,
    feats: TokenFeatures,
    objective: Objective,
    method: str,
    seed: int | None,
    internal_batch_size: Any,
    params: dict[str, Any],
    steps: list[int] | None = None,
) -> tuple[Tensor, Tensor, str, dict[str, Any], dict[str, int]]:
    """Rows of the target tokens ``steps`` (None: every one); the last is the streamed row."""
    seq2seq = isinstance(lm, Seq2SeqLanguageModel)
    if not isinstance(lm.module, nn.Module) or (lm.embedding_layer is None and not seq2seq):
        raise UnsupportedGenerationMethodError(
            f"{method} needs the model's token embedding layer: a Hugging Face causal LM, or "
            "an nn.Module with forward_cached and an embedding_layer attribute; use a "
            "perturbation method for other models",
            argument="method",
        )
    ran, extra, post_abs = counterpart(method)
    given = dict(params)
    if method == "saliency":
        post_abs = post_abs and given.pop("abs", True) is not False
    if "abs" in given:
        raise InvalidArgumentError(f"{method} takes no parameter 'abs'", argument="abs")
    target_ids = objective.target
    check_length(lm, [tuple(feats.base)], int(target_ids.numel()))
    t = int(target_ids.numel())
    rows = list(range(t)) if steps is None else steps
    ones = torch.ones(len(rows), feats.n, dtype=torch.long)
    module: nn.Module
    if isinstance(lm, Seq2SeqLanguageModel):
        module, layer = _SourceScores(lm, feats, target_ids, objective.step_fn()), "source_embed"
    else:
        module = _TargetScores(lm, feats, target_ids, objective.step_fn())
        layer = f"lm.{lm.embedding_layer}"
    with at_most(captum_pass(ran, {**extra, **given, "layer": layer}, feats.n)):
        res = attribute(
            module,
            ones,
            ran,
            target=rows,
            baselines=0,
            seed=seed,
            internal_batch_size=internal_batch_size,
            layer=layer,
            **extra,
            **given,
        )
    a = res.attributions
    if not isinstance(a, Tensor):
        raise TypeError("unexpected attribution form")  # the embedding gives one tensor
    a = a.detach()
    per_token = (a.abs() if post_abs else a).sum(-1)  # [rows, L + T]
    token_attr = per_token[:, torch.tensor(feats.positions, device=per_token.device)].cpu()
    echo = {k: v for k, v in res.params.items()}
    echo["seed"] = seed
    return token_attr.sum(0), token_attr, ran, echo, {"forwards": 0}


def captum_pass(method: str, params: dict[str, Any], n_features: int) -> int:
    """The rows of Captum's one pass for one answer token (its ``internal_batch_size`` unset):
    the most an "auto" chunk takes here, where one call runs every answer token. The method's
    rows per example; ``n_steps="auto"``, which Captum has not, counts as the default step
    count. Params that do not validate give no cap (the attribution reports them)."""
    entry = registry.get(method)
    fields = entry.params.model_fields
    given = {k: v for k, v in params.items() if k in fields}
    if given.get("n_steps") == "auto":
        given.pop("n_steps")
    try:
        p = entry.params(**given)
    except ValidationError:
        return 1 << 62
    return entry.cost(p, CostShape(input_shapes=((n_features,),)))
