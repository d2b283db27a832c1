"""What a kind of model decides, after LitServe's ``LitAPI``: how a request becomes work (server
side, no model), how the worker sets the loaded model up, and how the result becomes a
response. One module per kind implements it (``service.kinds.tensor``, ``causal_lm``,
``exported``); ``service.kinds.of(spec)`` chooses the kind once from the model's spec. The work
a kind builds is typed (``service.core.work``): the worker runs it by its type, through the
run its module registered (``@runs``).

Everything around these steps is shared and kind-blind: the serving use cases (deadlines,
pictures, KServe and OIP bodies), the pool (queue, batching, worker processes) and the worker
loop (cancellation, errors as data).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from methods.engine.call import steps_of
from model_registry.spec import ExplainSpec, LoadedModel, ModelSpec
from service.core.errors import UnsupportedMethod
from service.core.settings import Settings
from service.core.work import Attribution, Prediction, Reply, Work
from service.kinds import features
from service.kinds.plan import Plan
from service.wire import codec
from service.wire.attributions import AttributionRequest

T = TypeVar("T")


@dataclass(frozen=True)
class Catalogue:
    """What a model offers, as its kind describes it from its spec (``ModelInfo`` shows it;
    KServe's ``:explain`` and the pictures read it)."""

    #: the method names it serves as requested (``ModelInfo.methods``)
    methods: list[str]
    #: the explanation KServe's ``:explain`` gives without parameters
    explanation: ExplainSpec
    #: the target of an explanation that names none (each example's predicted class, or null)
    target: Any
    #: whether it takes raw texts (before its workers say so)
    tokenizer: bool
    #: pictures drawn per example
    pictures: int
    #: an example is an object of these fields (a question-answering model's question and
    #: context), where the protocols' instances are taken as they come; None: inputs by name
    example_fields: tuple[str, ...] | None = None
    #: None where it gives predictions (``:predict``, OIP infer, ``:explain``'s, and so the
    #: metrics, attacks and counterfactuals that need its own forward); else why not (as its
    #: task says: ``Task.predicts``; whether jobs take it is the task's too: ``Task.jobs``)
    no_predictions: str | None = None

    @property
    def predicts(self) -> bool:
        return self.no_predictions is None


def predicted_target(spec: ModelSpec) -> Any:
    """Each example's predicted class, or null on models with one output value per example."""
    scalar = all(d == 1 for d in spec.output.shape)
    return None if scalar else "predicted"


class ModelKind(ABC):
    """The interface of a kind of model (one instance per kind, stateless): seven hooks."""

    #: the family's name, as the tasks it serves give it (``model_registry.tasks.Task.family``)
    name: ClassVar[str]

    @abstractmethod
    def describe(self, spec: ModelSpec) -> Catalogue:
        """What ``spec`` offers (no model needed)."""

    @abstractmethod
    def check(
        self, spec: ModelSpec, method: str, params: dict[str, Any], settings: Settings | None
    ) -> Plan:
        """What the engine runs for ``method`` with ``params`` on ``spec``, or a 4xx
        ServiceError saying why it cannot; with ``settings``, the params are validated too
        (models.toml ``explain`` is checked so at start-up)."""

    # -- server side: request -> work ---------------------------------------------------------
    @abstractmethod
    def build_work(
        self,
        settings: Settings,
        spec: ModelSpec,
        req: AttributionRequest,
        deadline: float,
        request_id: str = "",
    ) -> Work:
        """Every check that needs no model: the request as work (an ``Attribution``, or the
        kind's own), or a 4xx ServiceError."""

    def predict_work(
        self, settings: Settings, spec: ModelSpec, inputs: Any, deadline: float, request_id: str
    ) -> Prediction:
        """The model's outputs for ``inputs`` as a job (KServe ``:predict``, OIP infer)."""
        raise self.no_predictions(spec)

    # -- worker side --------------------------------------------------------------------------
    def prepare(self, lm: LoadedModel) -> dict[str, Any]:
        """Set-up after loading, before the worker says ready; what the parent learns of it
        (``compiled``, ``compile_error``, ``verification``, ``not_ready``, ``precision``)."""
        from service.kinds.prepare import precision_of  # worker side only

        return {"compiled": False, "compile_error": None, "verification": None, "not_ready": None,
                "precision": precision_of(lm)}  # fmt: skip

    # -- server side: result -> response ------------------------------------------------------
    def response(
        self,
        spec: ModelSpec,
        work: Work,
        reply: Reply,
        timing: dict[str, float],
        encoding: str = "json",
        requested: str | None = None,
    ) -> dict[str, Any]:
        """The attributions response body; ``requested``: the method the request named."""
        if not isinstance(work, Attribution):
            raise TypeError(f"{self.name} answers attributions, not {type(work).__name__}")
        return envelope((spec.id, spec.version), Ran.of(work), with_segments(work, reply),
                        encoding, timing)  # fmt: skip

    def drawn(self, reply: Reply) -> Reply:
        """What the pictures draw of a reply (its attributions, tokens and target)."""
        return reply

    # -- not hooks: read from the hooks ---------------------------------------------------------
    def catalogue(self, spec: ModelSpec) -> Catalogue:
        """``describe(spec)``, once per spec object (requests read it; listing the methods a
        tensor model serves plans every method)."""
        got = _CATALOGUES.get(id(spec))
        if got is not None and got[0] is spec:
            return got[1]
        out = self.describe(spec)
        with _CATALOGUES_LOCK:  # requests are built on threads too
            if len(_CATALOGUES) >= 256:  # specs are replaced on reload: drop the oldest
                del _CATALOGUES[next(iter(_CATALOGUES))]
            _CATALOGUES[id(spec)] = (spec, out)
        return out

    def no_predictions(self, spec: ModelSpec) -> UnsupportedMethod:
        """The 4xx for a prediction asked of a model that gives none (its catalogue says why)."""
        why = self.catalogue(spec).no_predictions or "gives no predictions"
        return UnsupportedMethod(f"model {spec.id!r} {why}", loc=("path", "model_id"))


#: ``ModelKind.catalogue``'s: id(spec) -> (the spec, held so its id is not reused; its catalogue)
_CATALOGUES: dict[int, tuple[ModelSpec, Catalogue]] = {}
_CATALOGUES_LOCK = threading.Lock()


def with_segments(work: Work, reply: Reply) -> Reply:
    """``reply`` with the regions its answer credits: the method's own (XRAI's), else the
    superpixels the server drew for the request (``service.kinds.features``)."""
    if reply.segments is not None:
        return reply
    drawn = features.drawn_segments(work)
    return reply if drawn is None else dataclasses.replace(reply, segments=drawn)


def timing(queue_ms: float, compute_ms: float, started: float) -> dict[str, float]:
    """``timing_ms``: queued, computing, and in all since the request arrived."""
    return {
        "queue": round(queue_ms, 3),
        "compute": round(compute_ms, 3),
        "total": round((time.perf_counter() - started) * 1e3, 3),
    }


@dataclass(frozen=True)
class Ran:
    """What ran for a request, as its answer says: the engine's method, the method the
    request named, and the layer a token model's rewrite attributed to."""

    method: str
    requested: str | None = None
    attributed_layer: str | None = None

    @classmethod
    def of(cls, work: Attribution) -> Ran:
        return cls(work.method, work.requested, work.attributed_layer)

    def members(self) -> dict[str, Any]:
        """``method``, and ``requested_method`` and ``attributed_layer`` where they tell
        something (always both on a rewritten request)."""
        out: dict[str, Any] = {"method": self.method}
        if self.attributed_layer is not None:
            if self.requested is not None:
                out["requested_method"] = self.requested
            out["attributed_layer"] = self.attributed_layer
        elif self.requested is not None and self.requested != self.method:
            out["requested_method"] = self.requested
        return out


def grouped(parts: list[T], reply: Reply) -> Any:
    """The engine's structure of ``parts`` (one per attributed tensor, in order): one, a
    tuple (a list) per input, or one entry per layer of a list of layers."""
    if reply.layers is not None:
        out: list[Any] = []
        at = 0
        for count in reply.layers:
            out.append(parts[at] if count == 1 else parts[at : at + count])
            at += count
        return out
    if reply.as_tuple:
        return parts
    return parts[0] if parts else []


def envelope(
    model: tuple[str, str],
    ran: Ran,
    reply: Reply,
    encoding: str,
    timing_ms: dict[str, float],
) -> dict[str, Any]:
    """The one attributions response body, from a reply: synchronous answers (a kind adds
    its own members), a job's result (chunks joined into one reply), and what KServe's and
    OIP's explain reshape; ``model``: its id and version."""
    attributions = grouped([codec.encode_tensor(a, encoding) for a in reply.attributions], reply)
    delta: Any = None if reply.delta is None else codec.encode_tensor(reply.delta, encoding)
    if reply.layers is not None and reply.delta is not None:  # (N, layers): one per layer
        delta = [codec.encode_tensor(np.ascontiguousarray(d), encoding) for d in reply.delta.T]
    body: dict[str, Any] = {
        "model_id": model[0],
        "model_version": model[1],
        "method": ran.method,
        "attributions": attributions,
        "convergence_delta": delta,
        "target": reply.target,
        "outputs": None if reply.outputs is None else codec.encode_tensor(reply.outputs, encoding),
        "params": reply.params,
        "merged_requests": reply.merged,
        "timing_ms": timing_ms,
        **ran.members(),
    }
    if reply.base_values is not None:
        body["base_values"] = codec.encode_tensor(reply.base_values, encoding)
    if reply.standard_error is not None:
        body["standard_error"] = grouped(
            [codec.encode_tensor(e, encoding) for e in reply.standard_error], reply
        )
    if reply.tokens is not None:
        body["tokens"] = reply.tokens
    if reply.units is not None:  # the tokens are the units' texts
        body["units"] = reply.units
    if reply.segments is not None:  # one [N, H, W] map per image input
        maps = [codec.encode_tensor(m, encoding) for m in reply.segments]
        body["feature_mask"] = maps[0] if len(maps) == 1 else maps
    for name in reply.study_rows or []:  # a task's own answer per example (answers, detections)
        if reply.study is not None and "." not in name:
            body[name] = reply.study[name]
    if reply.verification is not None:
        body["verification"] = reply.verification
    if reply.fidelity is not None:
        body["fidelity"] = reply.fidelity
    steps = steps_of(reply.params)
    if steps is not None:
        body["steps"] = steps
    if isinstance(reply.params.get("samples"), dict):  # n_samples "auto": what it took
        body["samples"] = reply.params["samples"]
    if reply.metrics is not None:
        body["metrics"] = reply.metrics
        timing_ms["metrics"] = round(reply.metrics_ms, 3)
    return body
