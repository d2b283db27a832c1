"""Causal language models as the generation engine sees them.

Four kinds, told apart by duck typing (``transformers`` is never imported here):

- a Hugging Face causal LM (``config``, ``get_input_embeddings``, ``generate``): its cache
  (``cache``, called ``past_key_values`` before transformers 5.24) holds a prompt prefix,
  cropped and repeated per batch;
- an attrserve KV model (``forward_cached(ids, past, keep_from) -> (logits, past)``, e.g. the
  built-in ``tiny-lm``): its cache is a tuple of per-layer ``(keys, values)`` tensors
  ``[B, heads, P, head_dim]``, sliced and expanded without copies;
- a Hugging Face encoder-decoder (``config.is_encoder_decoder``): the prompt is the source,
  the answer the decoder's (``Seq2SeqLanguageModel``);
- any other callable ``ids [B, L] -> logits [B, L, V]`` (or an object with ``.logits``): no
  cache, every perturbed prompt is run whole (still batched).

Every kind answers ``logits`` (optionally only from position ``keep_from`` on: the rest is
never needed), ``prefix`` (the logits of a reference prompt and answer, and their cache, or
None), ``logits_after`` (the logits of continuations of a cached prefix) and ``generate``
(greedy).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from methods.engine import hooks
from methods.errors import InvalidArgumentError
from methods.generation.errors import UnsupportedLanguageModelError

#: Captum's ``DEFAULT_GEN_ARGS`` (used when ``target`` is None and no ``gen_args`` are given)
DEFAULT_GEN_ARGS: dict[str, Any] = {
    "max_new_tokens": 25,
    "do_sample": False,
    "temperature": None,
    "top_p": None,
}
#: the gen_args models without ``generate`` understand (greedy decoding only)
GREEDY_ARGS = ("max_new_tokens", "do_sample", "temperature", "top_p")

KV = tuple[tuple[Tensor, Tensor], ...]


def _logits_of(out: Any) -> Tensor:
    logits = out.logits if hasattr(out, "logits") else out
    if not isinstance(logits, Tensor):
        raise UnsupportedLanguageModelError(
            f"the model returned {type(out).__name__}; expected logits [B, L, vocab] (a tensor "
            "or an object with .logits)",
            argument="model",
        )
    # Llama4-style heads return (B, 1, L, V) (as Captum, take the first)
    return logits[:, 0] if logits.dim() == 4 else logits


def _cache_of(out: Any) -> Any:
    """The cache a Hugging Face model returned (None: none)."""
    return next((out[k] for k in ("cache", "past_key_values") if k in out), None)


class LanguageModel:
    """Base: a plain callable ``ids -> logits``, without a cache."""

    #: the dotted path of the token embedding inside ``module`` (gradient methods attach there)
    embedding_layer: str | None = None
    #: an encoder-decoder: the prompt is the source, scored by ``target_logits``
    seq2seq = False

    def __init__(self, model: Any) -> None:
        self.model = model

    @property
    def module(self) -> Any:
        return self.model

    @property
    def max_length(self) -> int | None:
        """The most positions the model can attend to (None: unknown)."""
        return None

    # Both read the first parameter they need, not the list of all: the scorer asks ~100
    # times a call, and listing GPT-2's parameters each time was ~15% of a feature ablation's
    # time on an H200 (launch-bound there)
    @property
    def dtype(self) -> torch.dtype:
        params = self.model.parameters() if isinstance(self.model, nn.Module) else iter(())
        first = next((p for p in params if p.is_floating_point()), None)
        return first.dtype if first is not None else torch.get_default_dtype()

    @property
    def device(self) -> torch.device:
        params = self.model.parameters() if isinstance(self.model, nn.Module) else iter(())
        first = next(params, None)
        return first.device if first is not None else torch.device("cpu")

    @property
    def caches(self) -> bool:
        return False

    def logits(self, ids: Tensor, keep_from: int = 0) -> Tensor:
        return _logits_of(self.model(ids))[:, keep_from:]

    def prefix(self, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        """The logits of ``ids`` [1, P] from ``keep_from`` on, and a cache of them (None: this
        kind has none): one forward both scores a reference prompt and caches it."""
        return self.logits(ids, keep_from), None

    def logits_after(self, cache: Any, p: int, ids: Tensor, keep_from: int = 0) -> Tensor:
        """Logits of ``ids`` [B, S] continuing the first ``p`` cached tokens."""
        raise NotImplementedError

    def extend(self, state: Any, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        """Logits of ``ids`` [B, S] (from position ``keep_from`` of them on) after what
        ``state`` holds (None: nothing), and the state holding both: rows decoded on, one
        token at a time (streaming). Here the state is the ids so far, run whole each time."""
        full = ids if state is None else torch.cat([state, ids], dim=1)
        start = full.shape[1] - ids.shape[1] + keep_from
        return self.logits(full, keep_from=start), full

    def generate(self, ids: Tensor, gen_args: dict[str, Any], eos: int | None) -> Tensor:
        """Greedy continuation of ``ids`` [1, P]: the new ids (1-D), stopping after ``eos``."""
        steps = _greedy_steps(gen_args)
        out: list[int] = []
        cur = ids
        for _ in range(steps):
            nxt = int(self.logits(cur, keep_from=cur.shape[1] - 1)[0, -1].argmax())
            out.append(nxt)
            if eos is not None and nxt == eos:
                break
            cur = torch.cat([cur, cur.new_tensor([[nxt]])], dim=1)
        return torch.tensor(out, dtype=torch.long, device=ids.device)


def _greedy_steps(gen_args: dict[str, Any]) -> int:
    unknown = sorted(set(gen_args) - set(GREEDY_ARGS))
    if unknown:
        raise InvalidArgumentError(
            f"gen_args {unknown} are not understood by this model (it has no .generate); it "
            f"decodes greedily and takes only {list(GREEDY_ARGS)}",
            argument="gen_args",
        )
    if gen_args.get("do_sample"):
        raise InvalidArgumentError(
            "gen_args do_sample=True: this model decodes greedily only", argument="gen_args"
        )
    steps = gen_args.get("max_new_tokens", DEFAULT_GEN_ARGS["max_new_tokens"])
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise InvalidArgumentError(
            f"gen_args max_new_tokens must be a positive int, got {steps!r}", argument="gen_args"
        )
    return steps


class KVLanguageModel(LanguageModel):
    """attrserve's KV protocol: ``forward_cached(ids, past, keep_from) -> (logits, past)``."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.embedding_layer = getattr(model, "embedding_layer", None)

    @property
    def max_length(self) -> int | None:
        n = getattr(self.model, "max_positions", None)
        return int(n) if isinstance(n, int) else None

    @property
    def caches(self) -> bool:
        return True

    def logits(self, ids: Tensor, keep_from: int = 0) -> Tensor:
        logits, _ = self.model.forward_cached(ids, None, keep_from)
        return logits

    def prefix(self, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, KV]:
        logits, past = self.model.forward_cached(ids, None, keep_from)
        return logits, tuple(past)

    def logits_after(self, cache: KV, p: int, ids: Tensor, keep_from: int = 0) -> Tensor:
        b = int(ids.shape[0])
        past = tuple(
            (k[:, :, :p].expand(b, -1, -1, -1), v[:, :, :p].expand(b, -1, -1, -1)) for k, v in cache
        )
        logits, _ = self.model.forward_cached(ids, past, keep_from)
        return logits

    def extend(self, state: Any, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        logits, past = self.model.forward_cached(ids, state, keep_from)
        return logits, tuple(past)

    def generate(self, ids: Tensor, gen_args: dict[str, Any], eos: int | None) -> Tensor:
        steps = _greedy_steps(gen_args)
        max_len = self.max_length
        out: list[int] = []
        logits, past = self.model.forward_cached(ids, None, int(ids.shape[1]) - 1)
        pos = int(ids.shape[1])
        for _ in range(steps):
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            pos += 1
            if (eos is not None and nxt == eos) or (max_len is not None and pos >= max_len):
                break
            logits, past = self.model.forward_cached(ids.new_tensor([[nxt]]), past, 0)
        return torch.tensor(out, dtype=torch.long, device=ids.device)


class HFLanguageModel(LanguageModel):
    """A Hugging Face causal LM (``*ForCausalLM``): its cache holds the prefix."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        emb = model.get_input_embeddings()
        self.embedding_layer = next(
            (name for name, m in model.named_modules() if m is emb and name), None
        )
        params = inspect.signature(model.forward).parameters
        self._keep = "logits_to_keep" in params
        # transformers 5.24 renamed past_key_values to cache (the old name warns, then goes)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def _run(self, ids: Tensor, past: Any, keep_from: int) -> tuple[Tensor, Any]:
        """The logits of ``ids`` from ``keep_from`` on after the cache ``past`` (None: none),
        and the cache holding both."""
        s = int(ids.shape[1])
        args: dict[str, Any] = {self._cache_arg: past} if past is not None else {}
        out = self.model(input_ids=ids, use_cache=True, **args, **self._kept(s, keep_from))
        logits = _logits_of(out)
        return (logits[:, keep_from - s :] if keep_from > 0 else logits), _cache_of(out)

    @property
    def max_length(self) -> int | None:
        cfg = self.model.config
        for name in ("max_position_embeddings", "n_positions", "n_ctx"):
            n = getattr(cfg, name, None)
            if isinstance(n, int) and n > 0:
                return n
        return None

    @property
    def caches(self) -> bool:
        return True

    def _kept(self, s: int, keep_from: int) -> dict[str, Any]:
        # logits_to_keep=k keeps the last k positions; 0 keeps all
        return {"logits_to_keep": s - keep_from} if self._keep and keep_from > 0 else {}

    def logits(self, ids: Tensor, keep_from: int = 0) -> Tensor:
        s = int(ids.shape[1])
        kept = self._kept(s, keep_from)
        with _contiguous_head(self.model, bool(kept) and torch.is_grad_enabled()):
            out = self.model(input_ids=ids, use_cache=False, **kept)
        logits = _logits_of(out)
        return logits[:, keep_from - s :] if keep_from > 0 else logits

    def prefix(self, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        logits, cache = self._run(ids, None, keep_from)
        if cache is None or not all(
            callable(getattr(cache, m, None)) for m in ("crop", "batch_repeat_interleave")
        ):
            return logits, None  # a cache this engine cannot crop and repeat: prompts run whole
        return logits, (cache, int(ids.shape[1]))

    def logits_after(self, cache: Any, p: int, ids: Tensor, keep_from: int = 0) -> Tensor:
        full, length = cache
        past = copy.deepcopy(full)  # the model appends to the cache it is given
        if p < length:
            past.crop(p - length)  # negative: remove that many (transformers 4.x and 5.x)
        b = int(ids.shape[0])
        if b > 1:
            past.batch_repeat_interleave(b)
        return self._run(ids, past, keep_from)[0]

    def extend(self, state: Any, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        return self._run(ids, state, keep_from)

    def generate(self, ids: Tensor, gen_args: dict[str, Any], eos: int | None) -> Tensor:
        args = gen_args or DEFAULT_GEN_ARGS  # Captum: the defaults replace, not merge
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **args)
        return out[0, ids.shape[1] :]


@contextlib.contextmanager
def _contiguous_head(model: Any, on: bool) -> Iterator[None]:
    """While on: the output head gets its input contiguous. ``logits_to_keep`` hands it a
    slice of the hidden states, and a matmul of a strided 3-D slice that requires grad runs
    as a batched matmul (the weight expanded per row): GPT-2 small's head took as long for 5
    kept positions as for all 20, and layer IG of a 4-token answer was 1.5x its floor. The
    hook is removed on the way out (the caller's model keeps none)."""
    head = model.get_output_embeddings() if on else None
    if not isinstance(head, nn.Module):
        yield
        return
    handle = hooks.hold(
        head.register_forward_pre_hook,
        lambda _m, args: (args[0].contiguous(), *args[1:]) if args else None,
    )
    try:
        yield
    finally:
        handle.remove()


class Seq2SeqLanguageModel(LanguageModel):
    """A Hugging Face encoder-decoder (``*ForConditionalGeneration``, ``*ForSeq2SeqLM``): the
    prompt is the encoder's input (the source), the answer the decoder's, teacher-forced
    after the decoder's start token. Sources of a batch are right-padded under an attention
    mask; there is no prefix to share (every source is encoded whole)."""

    seq2seq = True

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        cfg = model.config
        start = getattr(cfg, "decoder_start_token_id", None)
        if start is None:
            start = getattr(
                getattr(model, "generation_config", None), "decoder_start_token_id", None
            )
        if start is None:
            raise UnsupportedLanguageModelError(
                "the encoder-decoder model's config names no decoder_start_token_id",
                argument="model",
            )
        self.start = int(start)
        pad = getattr(cfg, "pad_token_id", None)
        self.pad = int(pad) if pad is not None else 0
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @property
    def max_length(self) -> int | None:
        n = getattr(self.model.config, "max_position_embeddings", None)
        return n if isinstance(n, int) and n > 0 else None  # T5: relative positions, none

    @property
    def embed_scale(self) -> float:
        """What the encoder multiplies its token embeddings by (inseq's rule: the encoder's
        ``embed_scale`` attribute; newer embeddings scale inside)."""
        return float(getattr(self.model.get_encoder(), "embed_scale", 1.0) or 1.0)

    def batch(self, prompts: list[tuple[int, ...]]) -> tuple[Tensor, Tensor]:
        """Sources right-padded, and their attention mask."""
        width = max(len(q) for q in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, q in enumerate(prompts):
            ids[i, : len(q)] = torch.tensor(q, dtype=torch.long)
            mask[i, : len(q)] = 1
        return ids.to(self.device), mask.to(self.device)

    def decoder_ids(self, target: Tensor, b: int) -> Tensor:
        """The decoder's inputs for teacher forcing ``target`` [T]: [B, T]."""
        start = target.new_tensor([self.start])
        return torch.cat([start, target[:-1]]).to(self.device).expand(b, -1)

    def target_logits(
        self, prompts: list[tuple[int, ...]], target: Tensor, embeds: Tensor | None = None
    ) -> Tensor:
        """Each target step's logits after each source: [B, T, V] (``embeds``: the sources'
        scaled token embeddings instead of their ids)."""
        ids, mask = self.batch(prompts)
        kw: dict[str, Any] = {"inputs_embeds": embeds} if embeds is not None else {"input_ids": ids}
        out = self.model(
            attention_mask=mask,
            decoder_input_ids=self.decoder_ids(target, len(prompts)),
            use_cache=False,
            **kw,
        )
        return _logits_of(out)

    def logits(self, ids: Tensor, keep_from: int = 0) -> Tensor:
        raise UnsupportedLanguageModelError(
            "an encoder-decoder model scores an answer after a source (target_logits), not a "
            "continuation of one sequence",
            argument="model",
        )

    def begin(self, prompts: list[tuple[int, ...]], answer: list[int]) -> tuple[Tensor, Any]:
        """Decoding for a stream: each source encoded once, the decoder fed its start token
        and ``answer``; the logits of steps 0..len(answer) [B, 1 + len(answer), V], and the
        state ``extend`` decodes on (the encoder's states, the sources' mask, the decoder's
        cache)."""
        ids, mask = self.batch(prompts)
        dec = torch.tensor([[self.start, *answer]] * len(prompts), device=self.device)
        out = self.model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, use_cache=True)
        encoded = (out.encoder_last_hidden_state,)
        return _logits_of(out), (encoded, mask, _cache_of(out))

    def extend(self, state: Any, ids: Tensor, keep_from: int = 0) -> tuple[Tensor, Any]:
        """The decoder fed ``ids`` [B, S] more answer tokens after ``state`` (``begin``'s):
        their logits from ``keep_from`` on, and the state holding them."""
        encoded, mask, past = state
        if past is None:
            raise UnsupportedLanguageModelError(
                "the encoder-decoder model returned no decoder cache; its answer comes whole "
                "(attribute_generation), not streamed",
                argument="model",
            )
        out = self.model(
            encoder_outputs=encoded,
            attention_mask=mask,
            decoder_input_ids=ids,
            use_cache=True,
            **{self._cache_arg: past},
        )
        return _logits_of(out)[:, keep_from:], (encoded, mask, _cache_of(out))

    def generate(self, ids: Tensor, gen_args: dict[str, Any], eos: int | None) -> Tensor:
        args = gen_args or DEFAULT_GEN_ARGS
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **args)
        new = out[0]
        return new[1:] if new.numel() and int(new[0]) == self.start else new


def wrap(model: Any) -> LanguageModel:
    """The adapter for ``model`` (see the module docstring)."""
    if isinstance(model, LanguageModel):
        return model
    if callable(getattr(model, "forward_cached", None)):
        return KVLanguageModel(model)
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and callable(
        getattr(model, "get_encoder", None)
    ):
        return Seq2SeqLanguageModel(model)
    if (
        hasattr(model, "config")
        and callable(getattr(model, "get_input_embeddings", None))
        and callable(getattr(model, "generate", None))
    ):
        return HFLanguageModel(model)
    if callable(model):
        return LanguageModel(model)
    raise UnsupportedLanguageModelError(
        f"model must be a causal language model (a Hugging Face *ForCausalLM, a model with "
        f"forward_cached, or a callable ids -> logits), got {type(model).__name__}",
        argument="model",
    )
