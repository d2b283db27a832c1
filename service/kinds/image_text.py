"""Image–text similarity (CONTRACT 9.4, ``CLIPModel`` directories): each example an image and
a text, the output their similarity (``logits_per_image`` of the pair), attributed to the
image's pixels and the text's tokens at once (``model_registry.hf_clip``): gradient methods
along one path from both baselines (the zero image; the pad token, the tokens the tokenizer
adds kept), perturbation methods over the image's patches and the text's tokens together.
The answer's ``attributions`` is ``{"image": [...], "text": [...]}``, with ``tokens``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

import methods
from methods import registry
from methods.registry import CostShape
from model_registry.hf_clip import FIELDS
from model_registry.hf_text import PADDED
from model_registry.spec import ExplainSpec, LoadedModel, ModelSpec
from service.core.errors import InvalidRequest, UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Prediction, Reply, Work, new_id, runs
from service.kinds import checks, tensors
from service.kinds.base import Catalogue, ModelKind
from service.kinds.plan import Plan
from service.wire import images
from service.wire.attributions import AttributionRequest

LOC = ("body", "inputs")
#: the methods served: gradients along one path for both inputs; perturbations of patches
#: and tokens together
GRADIENT = ("integrated_gradients", "saliency", "input_x_gradient")
PERTURBATION = ("feature_ablation", "shapley_value_sampling", "kernel_shap", "lime")
#: request fields this kind does not take (each refused where given)
REFUSED = {
    "target": "an image–text model's output is the pair's similarity: there is no target",
    "baselines": "the baselines are the zero image and the pad token; send none",
    "noise_tunnel": "not served for image–text pairs",
    "metrics": "not served for image–text pairs",
    "precision": "image–text pairs run in the model's own dtype",
    "render": "pictures of image–text pairs are not drawn yet",
    "units": "an image–text pair's text is attributed by its tokens",
}


@dataclass(kw_only=True)
class PairAttribution(Attribution):
    """Attributions of image–text pairs' similarity."""

    label: ClassVar[str] = "attribution"


@dataclass(kw_only=True)
class PairPrediction(Prediction):
    """Image–text pairs' similarities (KServe ``:predict``, OIP infer)."""


def pairs(raw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """``[{"image", "text"}, ...]``: the images (as the images codec takes them) and the
    texts; a 422 naming the example and the missing field."""
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest('an image–text model takes [{"image": "<base64>", "text": "..."}]',
                             loc=LOC)  # fmt: skip
    shown, texts = [], []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidRequest('each example is {"image": "<base64>", "text": "..."}',
                                 loc=(*LOC, i))  # fmt: skip
        unknown = sorted(set(item) - set(FIELDS))
        if unknown:
            raise InvalidRequest(f"unknown fields {unknown}; an example is {{image, text}}",
                                 loc=(*LOC, i, unknown[0]))  # fmt: skip
        if "image" not in item:
            raise InvalidRequest("the pair's image is missing", loc=(*LOC, i, "image"))
        text = item.get("text")
        if not isinstance(text, str) or not text.strip():
            got = "missing" if "text" not in item else f"got {text!r}"[:80]
            raise InvalidRequest(f"the pair's text must be a non-empty text ({got})",
                                 loc=(*LOC, i, "text"))  # fmt: skip
        shown.append({"image": item["image"]})
        texts.append(text)
    return shown, texts


class ImageTextKind(ModelKind):
    name = "image_text"

    def describe(self, spec: ModelSpec) -> Catalogue:
        return Catalogue(
            methods=[*GRADIENT, *PERTURBATION],
            explanation=spec.explain or ExplainSpec("integrated_gradients"),
            target=None,
            tokenizer=True,
            pictures=1,
            example_fields=FIELDS,
        )

    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> Plan:
        if method not in (*GRADIENT, *PERTURBATION):
            raise UnsupportedMethod(
                f"{method!r} is not served for image–text pairs; methods: "
                f"{[*GRADIENT, *PERTURBATION]}",
                loc=("body", "method"),
            )
        ms = registry.get(method)
        if settings is not None:
            checks.validate_params(ms, checks.decode_params(ms, params, settings))
        return Plan(ms, dict(params))

    def predict_work(
        self, settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str
    ) -> Prediction:
        pixels, texts, files = _decoded(settings, spec, inputs)
        return PairPrediction(
            id=new_id(), model_id=spec.id, n=len(texts), cost=len(texts), arrays=(pixels,),
            texts=tuple(texts), images=files, deadline=deadline,
            max_tokens=settings.max_text_tokens, request_id=request_id,
        )  # fmt: skip

    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Work:
        for name, why in REFUSED.items():
            value = getattr(req, name)
            if value is not None and value is not False:
                raise InvalidRequest(f"{name}: {why}", loc=("body", name))
        if req.output != "raw":
            raise InvalidRequest("output: the similarity is attributed as it is (raw)",
                                 loc=("body", "output"))  # fmt: skip
        planned = self.check(spec, req.method, req.params, None)
        ms = planned.method
        p = checks.validate_params(ms, checks.decode_params(ms, planned.params, settings))
        checks.check_limits(ms, p, settings)
        pixels, texts, files = _decoded(settings, spec, req.inputs)
        longest = checks.check_texts(tuple(texts), settings)
        shape = CostShape((tuple(pixels.shape[1:]), (longest,)), 1, req.return_convergence_delta)
        rows = ms.cost(p, shape)
        checks.check_cost(rows * len(texts), len(texts), rows, settings, ms, p)
        return PairAttribution(
            id=new_id(), model_id=spec.id, method=ms.name, arrays=(pixels,), texts=tuple(texts),
            params=checks.given(p), seed=req.seed, return_delta=req.return_convergence_delta,
            deadline=deadline, n=len(texts), cost=rows * len(texts), requested=req.method,
            request_id=request_id, max_tokens=settings.max_text_tokens, images=files,
            internal_batch_size=req.internal_batch_size,
            perturbations_per_eval=req.perturbations_per_eval,
        )  # fmt: skip

    def response(
        self,
        spec: ModelSpec,
        work: Work,
        reply: Reply,
        timing: dict[str, float],
        encoding: str = "json",
        requested: str | None = None,
    ) -> dict[str, Any]:
        body = super().response(spec, work, reply, timing, encoding, requested)
        image, text = body["attributions"]
        body["attributions"] = {"image": image, "text": text}
        return body


def _decoded(
    settings: Settings, spec: ModelSpec, raw: Any
) -> tuple[np.ndarray, list[str], tuple[bytes, ...]]:
    """The pairs' images as ``pixel_values`` (and their files) and their texts."""
    shown, texts = pairs(raw)
    if len(shown) > settings.max_batch_size:
        raise InvalidRequest(f"at most {settings.max_batch_size} pairs a request", loc=LOC)
    limits = (settings.max_tensor_elements, settings.max_batch_size)
    pixels, files = images.decode(shown, spec, *limits, settings.max_image_pixels)
    return pixels, texts, files


def _pairs_in(lm: LoadedModel, work: Work) -> tuple[torch.Tensor, torch.Tensor, Any, Any]:
    """The work's pixels and ids on the model's device, the tokens and the tokenizer."""
    pixels = tensors.tensor(work.arrays[0], lm.device).to(lm.spec.inputs[0].torch_dtype)
    tokenize: Any = lm.tokenizer
    ids, tokens = tokenize(list(work.texts))
    return pixels, ids.to(lm.device), tokens, tokenize


@runs(PairPrediction)
def predict_pairs(lm: LoadedModel, work: PairPrediction) -> Reply:
    t0 = time.perf_counter()
    pixels, ids, tokens, _ = _pairs_in(lm, work)
    with torch.no_grad():
        out = lm.model(pixels, ids)
    return Reply(work_id=work.id, predictions=tensors.numpy(out), tokens=tokens,
                 compute_ms=(time.perf_counter() - t0) * 1e3)  # fmt: skip


@runs(PairAttribution)
def attribute_pairs(lm: LoadedModel, work: PairAttribution) -> Reply:
    t0 = time.perf_counter()
    model = lm.model
    pixels, ids, tokens, tokenize = _pairs_in(lm, work)
    base_ids = tokenize.baseline(ids)
    zeros = torch.zeros_like(pixels)
    kw: dict[str, Any] = {
        "internal_batch_size": work.internal_batch_size,
        "perturbations_per_eval": work.perturbations_per_eval,
        "seed": work.seed,
        "return_convergence_delta": work.return_delta,
        **{k: tensors.convert(v, lm.device) for k, v in work.params.items()},
    }
    if work.method in GRADIENT:  # one path for the pixels and the token embeddings

        def along(px: torch.Tensor, embeds: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
            return model(px, at, embeds)

        res = methods.attribute(
            along, (pixels, model.embedded(ids)), work.method,
            baselines=(zeros, model.embedded(base_ids)), additional_forward_args=(ids,), **kw,
        )  # fmt: skip
        image, text = res.attributions[0], res.attributions[1].sum(-1)
    else:  # the image's patches and the text's tokens, numbered after them
        patches = model.patches(tuple(pixels.shape)).to(lm.device)
        first = int(patches.max()) + 1
        words = (torch.arange(ids.shape[1], device=lm.device) + first).unsqueeze(0)
        res = methods.attribute(
            model, (pixels, ids), work.method, baselines=(zeros, base_ids),
            feature_mask=(patches, words), **kw,
        )  # fmt: skip
        image, text = res.attributions
    text = text.masked_fill(ids == PADDED, 0)
    with torch.no_grad():
        outputs = model(pixels, ids)
    delta: Any = res.convergence_delta
    return Reply(
        work_id=work.id,
        attributions=[tensors.numpy(image), tensors.numpy(text.to(image.dtype))],
        as_tuple=True,
        delta=None if delta is None else tensors.numpy(delta),
        outputs=tensors.numpy(outputs),
        predictions=tensors.numpy(outputs) if work.predictions else None,
        tokens=tokens,
        params=res.params,
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )
