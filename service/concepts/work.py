"""TCAV in the worker: a query's concept sets read from their files, their activations and
CAVs kept per (model version and weights, layer, set contents) in memory and on disk, so a
concept's activations at a layer are computed once and a CAV is fitted once, across requests
and restarts (CONTRACT 7.1).

Cache layout: ``<cache>/<version>-<weights digest>/tcav/<layer>/acts-<set digest>.pt`` and
``cav-<concept digest>-<random digest>-<classifier>-<seed>.pt``; each written whole to a
temporary file and renamed. Keyed by the weights' digest as well as the declared version, a
model whose file changed under the same version never gets another's CAVs.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from urllib.parse import quote

import torch

from methods.cancel import checkpoint
from methods.concepts import core as engine
from methods.concepts.cav import Cav, train_cav
from methods.errors import AttributionError, InvalidArgumentError
from model_registry.spec import LoadedModel
from service.concepts.protocol import read_set
from service.core.errors import Conflict
from service.core.files import atomic_write
from service.core.work import Reply, WireTarget, Work, runs
from service.kinds import tensors
from service.wire import targets
from service.wire.engine_errors import from_engine

#: where an engine error's argument sits in a TCAV body
WHERE: dict[str, tuple[str | int, ...]] = {
    "layers": ("body", "layers"),
    "concepts": ("body", "concepts"),
    "random_concepts": ("body", "random_concepts"),
    "inputs": ("body", "inputs"),
    "target": ("body", "target"),
}
#: bytes of activations and CAVs kept in a worker's memory, the least recent dropped past it
MEMORY_BYTES = 512 << 20
T = TypeVar("T")


def weights_digest(lm: LoadedModel) -> str:
    """sha256 of the model's parameters and buffers (once per load)."""
    found = lm.extra.get("weights_digest")
    if found is None:
        h = hashlib.sha256()
        model = lm.model
        state = model.state_dict() if isinstance(model, torch.nn.Module) else {}
        for name, value in state.items():
            h.update(name.encode())
            if isinstance(value, torch.Tensor):
                t = value.detach().to("cpu").contiguous()
                h.update(str(t.dtype).encode())
                h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        found = lm.extra["weights_digest"] = h.hexdigest()
    return str(found)


class Cache:
    """Values by key, in the worker's memory and as files under ``root``."""

    def __init__(self, lm: LoadedModel, root: Path) -> None:
        self.memory: OrderedDict[str, Any] = lm.extra.setdefault("tcav_cache", OrderedDict())
        self.root = root
        self.computed = 0

    def get(
        self,
        key: str,
        make: Callable[[], T],
        save: Callable[[T], dict[str, Any]],
        load: Callable[[dict[str, Any]], T],
    ) -> T:
        if key in self.memory:
            self.memory.move_to_end(key)
            found: T = self.memory[key]
            return found
        path = self.root / key
        value: T
        try:
            value = load(torch.load(path, weights_only=True))
        except (OSError, RuntimeError, KeyError, EOFError):  # not there, or unreadable: made
            value = make()
            self.computed += 1
            self.put(key, value, save)
        self.memory[key] = value
        return value

    def put(self, key: str, value: T, save: Callable[[T], dict[str, Any]]) -> None:
        atomic_write(self.root / key, lambda f: torch.save(save(value), f))
        self.memory[key] = value
        total = sum(_nbytes(v) for v in self.memory.values())
        while total > MEMORY_BYTES and len(self.memory) > 1:
            total -= _nbytes(self.memory.popitem(last=False)[1])


def _nbytes(value: Any) -> int:
    t = value.vector if isinstance(value, Cav) else value
    return int(t.numel() * t.element_size()) if isinstance(t, torch.Tensor) else 0


def _examples(lm: LoadedModel, work: Work, path: str, digest: str) -> Any:
    """A concept set's inputs as tensors for the model, from its file (the contents the
    query named: a set replaced meanwhile is a 409, never cached under the old digest)."""
    meta, arrays, texts = read_set(path)
    if meta["digest"] != digest:
        raise Conflict(
            f"concept set {meta['name']!r} was replaced while the query ran; send it again",
            loc=("body", "concepts"),
        )
    xs, _ = tensors.inputs(lm, replace(work, arrays=arrays, texts=texts, n=meta["n"]))
    return xs if len(xs) > 1 else xs[0]


def _layer_dir(layer: str) -> str:
    return quote(layer, safe="") or "_"


@dataclass(kw_only=True)
class ConceptQuery(Work):
    """A TCAV query: the target on the inputs, against the concept sets at the layers."""

    label: ClassVar[str] = "tcav"
    #: the scores count over all the examples: a job runs it whole
    divisible: ClassVar[bool] = False

    target: WireTarget = None
    seed: int | None = None
    #: the concept and random sets (files and digests), layers, classifier, cache directory
    study: dict[str, Any] = field(default_factory=dict)


@runs(ConceptQuery)
def run(lm: LoadedModel, work: ConceptQuery) -> Reply:
    try:
        return _run(lm, work)
    except AttributionError as exc:
        raise from_engine(exc, work.request_id, WHERE) from None


def _run(lm: LoadedModel, work: ConceptQuery) -> Reply:
    t0 = time.perf_counter()
    s = work.study or {}
    model = lm.model
    layers = engine.check_layers(model, s["layers"])
    xs, _ = tensors.inputs(lm, work)
    wire = work.target
    if targets.predicted(wire):
        wire = targets.of_predictions(tensors.forward(lm, xs))
    target = targets.to_engine(wire)
    grads = engine.layer_gradients(model, xs if len(xs) > 1 else xs[0], layers, target)
    seed = 0 if work.seed is None else int(work.seed)
    classifier = s["classifier"]
    cache = Cache(lm, Path(s["cache"]) / f"{quote(s['version'], safe='')}-{weights_digest(lm)}")
    sets = {**s["concepts"], **s["random_concepts"]}

    def activations(name: str, layer: str) -> torch.Tensor:
        checkpoint()
        digest = sets[name]["digest"]

        def save(t: torch.Tensor) -> dict[str, Any]:
            return {"acts": t.cpu()}

        def make() -> torch.Tensor:
            examples = _examples(lm, work, sets[name]["path"], digest)
            found = engine.layer_activations(model, examples, layers)
            for other, values in found.items():  # every layer from the one forward
                if other != layer:
                    cache.computed += 1
                    cache.put(f"tcav/{_layer_dir(other)}/acts-{digest}.pt", values, save)
            return found[layer]

        return cache.get(
            f"tcav/{_layer_dir(layer)}/acts-{digest}.pt",
            make,
            save,
            lambda d: d["acts"].to(grads[layer].device),
        )

    def fit(pos: str, neg: str, layer: str) -> Cav:
        key = f"{sets[pos]['digest']}-{sets[neg]['digest']}-{classifier}-{seed}"
        return cache.get(
            f"tcav/{_layer_dir(layer)}/cav-{key}.pt",
            lambda: _fit(
                activations(pos, layer),
                activations(neg, layer),
                classifier,
                seed,
                layer,
                pos,
                grads[layer].shape[1],
            ),
            lambda c: {
                "vector": c.vector.cpu(),
                "accuracy": torch.tensor([c.accuracy], dtype=torch.float64),
            },
            lambda d: Cav(d["vector"].to(grads[layer].device), float(d["accuracy"])),
        )

    randoms = list(s["random_concepts"])
    cavs = {c: {p: [fit(c, r, p) for r in randoms] for p in layers} for c in s["concepts"]}
    null = {p: [fit(a, b, p) for a in randoms for b in randoms if a != b] for p in layers}
    rows = engine.score_rows(grads, cavs, null, float(s["alpha"]))
    return Reply(
        work_id=work.id,
        study={"scores": rows, "computed": cache.computed},
        compute_ms=(time.perf_counter() - t0) * 1e3,
    )


def _fit(
    pos: torch.Tensor,
    neg: torch.Tensor,
    classifier: str,
    seed: int,
    layer: str,
    name: str,
    width: int,
) -> Cav:
    for acts in (pos, neg):
        if acts.shape[1] != width:
            raise InvalidArgumentError(
                f"at layer {layer!r} a set has {acts.shape[1]} features and the inputs "
                f"{width} (concept {name!r}); concept examples must have the inputs' shape"
                " (texts: the same number of tokens)",
                argument="concepts",
            )
    return train_cav(pos, neg, classifier=classifier, seed=seed)
