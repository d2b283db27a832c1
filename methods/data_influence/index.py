"""A persisted influence index: the training side computed once, queries answered from it.

``build_index`` computes the training set's per-example quantities under every checkpoint;
``query`` computes the test side with the same model and checkpoints (the index keeps their
learning rates and a fingerprint of their weights, not the weights) and scores it against the
index; ``index_self_influence`` needs no model at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from methods.data_influence import similarity as sim
from methods.data_influence.common import (
    InfluenceResult,
    Tensors,
    check_int,
    check_model,
    chunks,
    fingerprint,
    format_checkpoints,
    top_k,
)
from methods.data_influence.features import (
    Extractor,
    Setup,
    data,
    dot,
    draw_projections,
    embed,
    make_setup,
    self_dot,
    states,
)
from methods.data_influence.gradients import private_copy
from methods.errors import InvalidArgumentError, InvalidTypeError

FORMAT = "attrserve.influence_index/1"
Progress = Callable[[int, int], None]


@dataclass
class InfluenceIndex:
    """The training side of an influence computation, as plain tensors.

    Per checkpoint: ``grads`` (tracin_cp: the flattened per-example loss gradients
    (n_train, P), parameters in ``param_names`` order), or ``output_grads`` (n_train, out)
    and ``layer_inputs`` (n_train, in) (tracin_cp_fast). For tracin_cp_fast_rand_proj one
    ``embeddings`` (n_train, d) over all checkpoints and the ``projections`` it was drawn
    with (None: not projected); for similarity the flattened layer ``activations``."""

    method: str
    loss: str
    layers: list[str] | None
    lrs: list[float]
    n_train: int
    batch_size: int
    similarity: str = "cosine"
    projection_dim: int | None = None
    seed: int = 0
    param_names: list[str] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    output_grads: list[Tensor] = field(default_factory=list)
    layer_inputs: list[Tensor] = field(default_factory=list)
    embeddings: Tensor | None = None
    projections: tuple[Tensor, Tensor] | None = None
    activations: Tensor | None = None
    #: (n_checkpoints, 2): sum and sum of squares of each checkpoint's weights
    fingerprints: Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"tensors": {name: Tensor}, "metadata": json-able dict}``: save the tensors with
        safetensors (each contiguous, none sharing memory) or torch.save, the metadata as
        JSON. The tensors are the index's own, not copies."""
        tensors: dict[str, Tensor] = {}
        for key in ("grads", "output_grads", "layer_inputs"):
            for c, t in enumerate(getattr(self, key)):
                tensors[f"{key}.{c}"] = t
        for key in ("embeddings", "activations", "fingerprints"):
            if getattr(self, key) is not None:
                tensors[key] = getattr(self, key)
        if self.projections is not None:
            tensors["projections.output"], tensors["projections.input"] = self.projections
        metadata = {
            "format": FORMAT,
            "method": self.method,
            "loss": self.loss,
            "layers": self.layers,
            "lrs": list(self.lrs),
            "n_train": self.n_train,
            "batch_size": self.batch_size,
            "similarity": self.similarity,
            "projection_dim": self.projection_dim,
            "seed": self.seed,
            "param_names": list(self.param_names),
        }
        return {
            "tensors": {k: v.detach().contiguous() for k, v in tensors.items()},
            "metadata": metadata,
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> InfluenceIndex:
        """The index ``to_dict`` described."""
        if not isinstance(value, Mapping) or not {"tensors", "metadata"} <= set(value):
            raise InvalidTypeError(
                "an influence index dict has 'tensors' and 'metadata'", argument="index"
            )
        tensors, meta = value["tensors"], value["metadata"]
        if not isinstance(meta, Mapping) or meta.get("format") != FORMAT:
            raise InvalidArgumentError(
                f"not an influence index (metadata format must be {FORMAT!r})", argument="index"
            )
        try:
            n = len(meta["lrs"])
            lists = {
                key: [tensors[f"{key}.{c}"] for c in range(n)] if f"{key}.0" in tensors else []
                for key in ("grads", "output_grads", "layer_inputs")
            }
            projections = None
            if "projections.output" in tensors:
                projections = (tensors["projections.output"], tensors["projections.input"])
            index = cls(
                method=str(meta["method"]),
                loss=str(meta["loss"]),
                layers=None if meta["layers"] is None else [str(p) for p in meta["layers"]],
                lrs=[float(lr) for lr in meta["lrs"]],
                n_train=int(meta["n_train"]),
                batch_size=int(meta["batch_size"]),
                similarity=str(meta["similarity"]),
                projection_dim=None
                if meta["projection_dim"] is None
                else int(meta["projection_dim"]),
                seed=int(meta["seed"]),
                param_names=[str(p) for p in meta["param_names"]],
                projections=projections,
                embeddings=tensors.get("embeddings"),
                activations=tensors.get("activations"),
                fingerprints=tensors.get("fingerprints"),
                **lists,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"the influence index is incomplete: {type(exc).__name__}: {exc}",
                argument="index",
            ) from exc
        return index


def build(s: Setup, xs: Tensors, y: Tensor | None, progress: Progress | None) -> InfluenceIndex:
    """The index of the training set ``xs, y`` under the checked settings ``s``."""
    ext = Extractor(s)
    total = len(chunks(xs[0].shape[0], s.batch_size)) * max(1, len(s.checkpoints))
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    index = InfluenceIndex(
        method=s.method,
        loss=s.loss,
        layers=s.layers,
        lrs=[cp.lr for cp in s.checkpoints],
        n_train=xs[0].shape[0],
        batch_size=s.batch_size,
        similarity=s.similarity,
        projection_dim=s.projection_dim,
        seed=s.seed,
        param_names=list(s.names),
    )
    if s.method == "similarity":
        parts = []
        for _, _, f in ext.chunked(None, xs, y):
            parts.append(f[0])
            step()
        index.activations = torch.cat(parts, dim=0)
        return index
    prints, embeddings, drawn = [], [], False
    for lr, state in states(s):
        prints.append(fingerprint(state))
        cols = []
        for _, _, f in ext.chunked(state, xs, y):
            if s.method == "tracin_cp_fast_rand_proj":
                if not drawn:
                    index.projections = draw_projections(s.seed, s.projection_dim, *f)
                    drawn = True
                f = (embed(f, index.projections, lr),)
            cols.append(f)
            step()
        feats = [torch.cat(col, dim=0) for col in zip(*cols, strict=True)]
        if s.method == "tracin_cp":
            index.grads.append(feats[0])
        elif s.method == "tracin_cp_fast":
            index.output_grads.append(feats[0])
            index.layer_inputs.append(feats[1])
        else:
            embeddings.append(feats[0])
    if embeddings:
        index.embeddings = torch.cat(embeddings, dim=1)
    index.fingerprints = torch.stack(prints)
    return index


def answer(
    index: InfluenceIndex,
    s: Setup,
    xs: Tensors,
    y: Tensor | None,
    k: int | None,
    proponents: bool,
    *,
    verify: bool,
) -> InfluenceResult:
    """Scores of the test examples ``xs, y`` against the index (top ``k`` if given)."""
    ext = Extractor(s)
    largest = proponents
    if s.method == "similarity":
        if index.activations is None:
            raise InvalidArgumentError("the index holds no activations", argument="index")
        test = ext.whole(None, xs, y)[0]
        scores = sim.scores(s.similarity, test, index.activations, proponents)
        largest = sim.largest_first(s.similarity, proponents)
    else:
        total: Tensor | None = None
        parts = []
        for c, (lr, state) in enumerate(states(s)):
            if verify:
                _verify(index, c, fingerprint(state))
            f = ext.whole(state, xs, y)
            if s.method == "tracin_cp_fast_rand_proj":
                parts.append(embed(f, index.projections, lr))
                continue
            train = (index.grads[c],) if s.method == "tracin_cp" else _fast(index, c)
            contribution = dot(s.method, f, train) * lr
            total = contribution if total is None else total + contribution
        if s.method == "tracin_cp_fast_rand_proj":
            if index.embeddings is None:
                raise InvalidArgumentError("the index holds no embeddings", argument="index")
            total = torch.matmul(torch.cat(parts, dim=1), index.embeddings.T)
        if total is None:
            raise InvalidArgumentError("the index holds no checkpoints", argument="index")
        scores = total
    if k is None:
        return InfluenceResult(scores)
    return top_k(scores, k, largest)


def _fast(index: InfluenceIndex, c: int) -> tuple[Tensor, Tensor]:
    return index.output_grads[c], index.layer_inputs[c]


def _verify(index: InfluenceIndex, c: int, seen: Tensor) -> None:
    if index.fingerprints is None:
        return
    want = index.fingerprints[c].tolist()
    if not all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        for a, b in zip(want, seen.tolist(), strict=True)
    ):
        raise InvalidArgumentError(
            f"checkpoint {c} differs from the one the index was built with", argument="checkpoints"
        )


def check_k(k: object, n_train: int) -> int | None:
    return None if k is None else check_int(k, "k", low=1, high=n_train)


def check_proponents(proponents: object) -> bool:
    if not isinstance(proponents, bool):
        raise InvalidTypeError(
            f"proponents must be True or False, got {proponents!r}", argument="proponents"
        )
    return proponents


def build_index(
    model: Any,
    train_inputs: Tensor | tuple[Tensor, ...],
    train_labels: Tensor | None,
    *,
    method: str = "tracin_cp",
    checkpoints: list[Any] | None = None,
    loss: str = "cross_entropy",
    layers: str | list[str] | None = None,
    batch_size: int | None = None,
    projection_dim: int | None = None,
    seed: int | None = None,
    similarity: str = "cosine",
    progress: Progress | None = None,
) -> InfluenceIndex:
    """The training set's index for ``query``; ``progress(done, total)`` is called after each
    chunk of ``batch_size`` examples under each checkpoint (``total`` of them)."""
    s = make_setup(
        model,
        method=method,
        checkpoints=checkpoints,
        loss=loss,
        layers=layers,
        batch_size=batch_size,
        projection_dim=projection_dim,
        seed=seed,
        similarity=similarity,
    )
    xs, y = data(s.method, train_inputs, train_labels, "train_inputs", "train_labels")
    return build(s, xs, y, progress)


def query(
    index: InfluenceIndex,
    model: Any,
    inputs: Tensor | tuple[Tensor, ...],
    labels: Tensor | None = None,
    *,
    checkpoints: list[Any] | None = None,
    k: int | None = None,
    proponents: bool = True,
) -> InfluenceResult:
    """Influence of the index's training examples on ``inputs``: the same model and the same
    checkpoints (same order and lrs; their weights are checked against the index's
    fingerprints) as ``build_index`` had; similarity takes no checkpoints."""
    if not isinstance(index, InfluenceIndex):
        raise InvalidTypeError(
            f"index must be an InfluenceIndex, got {type(index).__name__}", argument="index"
        )
    module = private_copy(check_model(model))
    cps = format_checkpoints(checkpoints, index.method)
    if [cp.lr for cp in cps] != list(index.lrs):
        raise InvalidArgumentError(
            f"the index was built with {len(index.lrs)} checkpoints of lrs {index.lrs}; got "
            f"{[cp.lr for cp in cps]}",
            argument="checkpoints",
        )
    own = {name for name, _ in module.named_parameters()}
    missing = [name for name in index.param_names if name not in own]
    if missing:
        raise InvalidArgumentError(
            f"the model has no parameters {missing[:5]} the index was built on", argument="model"
        )
    xs, y = data(index.method, inputs, labels, "inputs", "labels")
    s = Setup(
        model=module,
        method=index.method,
        loss=index.loss,
        checkpoints=cps,
        batch_size=index.batch_size,
        layers=index.layers,
        names=list(index.param_names),
        similarity=index.similarity,
        projection_dim=index.projection_dim,
        seed=index.seed,
    )
    k = check_k(k, index.n_train)
    return answer(index, s, xs, y, k, check_proponents(proponents), verify=True)


def index_self_influence(index: InfluenceIndex) -> Tensor:
    """Each training example's influence on itself (n_train,), as Captum's
    ``self_influence``; not defined for tracin_cp_fast_rand_proj and similarity."""
    if not isinstance(index, InfluenceIndex):
        raise InvalidTypeError(
            f"index must be an InfluenceIndex, got {type(index).__name__}", argument="index"
        )
    if index.method not in ("tracin_cp", "tracin_cp_fast"):
        raise InvalidArgumentError(
            f"self influence is not defined for {index.method} (Captum raises "
            "NotImplementedError for TracInCPFastRandProj); use tracin_cp or tracin_cp_fast",
            argument="method",
        )
    total: Tensor | None = None
    for c, lr in enumerate(index.lrs):
        train = (index.grads[c],) if index.method == "tracin_cp" else _fast(index, c)
        contribution = self_dot(index.method, train) * lr
        total = contribution if total is None else total + contribution
    if total is None:
        raise InvalidArgumentError("the index holds no checkpoints", argument="index")
    return total


#: the index's tensors with one row per training example (the rest: the same for every chunk)
PER_EXAMPLE = ("grads", "output_grads", "layer_inputs", "embeddings", "activations")


def concat(parts: list[InfluenceIndex]) -> InfluenceIndex:
    """The index of a training set built in consecutive chunks: each ``build_index`` of one
    chunk, in order (their settings, checkpoints and projections must agree)."""
    if not parts:
        raise InvalidArgumentError("no index parts to join", argument="index")
    first = parts[0]
    for p in parts[1:]:
        same = (p.method, p.loss, p.layers, p.lrs, p.param_names, p.projection_dim, p.seed)
        if same != (
            first.method,
            first.loss,
            first.layers,
            first.lrs,
            first.param_names,
            first.projection_dim,
            first.seed,
        ):
            raise InvalidArgumentError(
                "index parts were built with different settings", argument="index"
            )
    joined: dict[str, Any] = {}
    for key in ("grads", "output_grads", "layer_inputs"):
        lists = [getattr(p, key) for p in parts]
        joined[key] = [torch.cat([ts[c] for ts in lists]) for c in range(len(lists[0]))]
    for key in ("embeddings", "activations"):
        values = [getattr(p, key) for p in parts]
        joined[key] = None if values[0] is None else torch.cat(values)
    return replace(first, n_train=sum(p.n_train for p in parts), **joined)
