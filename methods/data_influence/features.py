"""What each method computes per example and checkpoint, and how two sets of it make scores.

- ``tracin_cp``: the flattened loss gradient with respect to the chosen parameters (n, P);
  score ``lr * <g_test, g_train>`` (Captum ``TracInCP``).
- ``tracin_cp_fast``: the loss gradient at the linear layer's output (n, out) and the layer's
  input (n, in); score ``lr * <g_test, g_train> * <a_test, a_train>`` (``TracInCPFast``).
- ``tracin_cp_fast_rand_proj``: the fast factors, randomly projected, as one embedding per
  example: ``sqrt(lr) * flatten(outer(g P_g, a P_a))`` concatenated over checkpoints; score
  the dot product of embeddings (``TracInCPFastRandProj``).
- ``similarity``: the layer's activations, flattened (``SimilarityInfluence``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from methods.cancel import checkpoint as cancel_point
from methods.data_influence.common import (
    FAST,
    LOSSES,
    METHODS,
    SIMILARITIES,
    Checkpoint,
    State,
    Tensors,
    check_batch_size,
    check_choice,
    check_int,
    check_model,
    check_seed,
    chunks,
    format_checkpoints,
    format_inputs,
    format_labels,
    layer_paths,
    one_layer,
)
from methods.data_influence.gradients import (
    ParamGrads,
    activations,
    fast_features,
    parameter_names,
    private_copy,
)
from methods.errors import InvalidArgumentError

Features = tuple[Tensor, ...]


@dataclass
class Setup:
    """Checked settings of one influence computation."""

    model: nn.Module
    method: str
    loss: str
    checkpoints: list[Checkpoint]
    batch_size: int
    layers: list[str] | None
    names: list[str]
    similarity: str
    projection_dim: int | None
    seed: int

    @property
    def layer(self) -> str:
        """The one layer of the fast and similarity methods."""
        return self.layers[0] if self.layers else ""


def make_setup(
    model: object,
    *,
    method: object,
    checkpoints: object,
    loss: object,
    layers: object,
    batch_size: object,
    projection_dim: object = None,
    seed: object = None,
    similarity: object = "cosine",
) -> Setup:
    module = check_model(model)
    method = check_choice(method, METHODS, "method")
    loss = check_choice(loss, tuple(LOSSES), "loss")
    cps = format_checkpoints(checkpoints, method)
    paths = layer_paths(layers)
    names: list[str] = []
    if method == "tracin_cp":
        names = parameter_names(module, paths)
    else:
        paths = [one_layer(module, paths, method)]
    size = check_batch_size(batch_size)
    dim = None if projection_dim is None else check_int(projection_dim, "projection_dim", low=1)
    return Setup(
        model=private_copy(module),
        method=method,
        loss=loss,
        checkpoints=cps,
        batch_size=size,
        layers=paths,
        names=names,
        similarity=check_choice(similarity, SIMILARITIES, "similarity"),
        projection_dim=dim,
        seed=check_seed(seed),
    )


def data(
    method: str, inputs: object, labels: object, argument: str, labels_argument: str
) -> tuple[Tensors, Tensor | None]:
    """Inputs as a tuple, and their labels (optional for similarity)."""
    xs = format_inputs(inputs, argument)
    if method == "similarity" and labels is None:
        return xs, None
    return xs, format_labels(labels, xs[0].shape[0], labels_argument, argument)


def states(s: Setup) -> Iterator[tuple[float, State]]:
    """Each checkpoint's learning rate and weights, loaded one at a time."""
    for cp in s.checkpoints:
        yield cp.lr, cp.load(s.model)


class Extractor:
    """The method's per-example features of a chunk under one checkpoint."""

    def __init__(self, s: Setup) -> None:
        self.s = s
        self.grads = ParamGrads(s.model, s.names, s.loss) if s.method == "tracin_cp" else None

    def __call__(self, state: State | None, xs: Tensors, y: Tensor | None) -> Features:
        cancel_point()
        s = self.s
        if s.method == "similarity":
            return (activations(s.model, s.layer, xs),)
        if y is None or state is None:
            raise InvalidArgumentError(f"{s.method} needs labels", argument="labels")
        if self.grads is not None:
            return (self.grads(state, xs, y),)
        return fast_features(s.model, state, s.layer, s.loss, xs, y)

    def chunked(
        self, state: State | None, xs: Tensors, y: Tensor | None
    ) -> Iterator[tuple[int, int, Features]]:
        """(start, end, features) of each chunk of ``batch_size`` examples."""
        for start, end in chunks(xs[0].shape[0], self.s.batch_size):
            part = tuple(x[start:end] for x in xs)
            yield start, end, self(state, part, None if y is None else y[start:end])

    def whole(self, state: State | None, xs: Tensors, y: Tensor | None) -> Features:
        """The features of all examples, computed chunk by chunk."""
        parts = [f for _, _, f in self.chunked(state, xs, y)]
        return tuple(torch.cat(col, dim=0) for col in zip(*parts, strict=True))


def dot(method: str, test: Features, train: Features) -> Tensor:
    """(n_test, n_train) products of one checkpoint's features (without its lr)."""
    out = test[0] @ train[0].T
    if method in FAST:
        out = out * (test[1] @ train[1].T)
    return out


def self_dot(method: str, train: Features) -> Tensor:
    """Each example's product with itself (without the lr), as Captum computes it."""
    if method in FAST:
        return torch.sum(train[0] ** 2, dim=1) * torch.sum(train[1] ** 2, dim=1)
    return torch.linalg.vector_norm(train[0], dim=1) ** 2


def draw_projections(
    seed: int, projection_dim: int | None, g: Tensor, a: Tensor
) -> tuple[Tensor, Tensor] | None:
    """TracInCPFastRandProj's projection matrices, drawn as Captum draws them after
    ``torch.manual_seed(seed)``, but from a private generator (the global one is left
    alone): its DataLoader iterator first takes one int64 for its base seed, then the
    (out, d_out) and (in, d_in) normal matrices are drawn in float32. None when
    ``out * in <= projection_dim`` or ``projection_dim`` is None (no projection)."""
    jacobian_dim, input_dim = g.shape[1], a.shape[1]
    if projection_dim is None or jacobian_dim * input_dim <= projection_dim:
        return None
    gen = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=gen)
    jacobian_proj_dim = min(int(projection_dim**0.5), jacobian_dim)
    input_proj_dim = min(int(projection_dim**0.5), input_dim)
    jacobian_projection = torch.normal(
        torch.zeros(jacobian_dim, jacobian_proj_dim), 1.0 / jacobian_proj_dim**0.5, generator=gen
    )
    input_projection = torch.normal(
        torch.zeros(input_dim, input_proj_dim), 1.0 / input_proj_dim**0.5, generator=gen
    )
    return (
        jacobian_projection.to(device=g.device, dtype=g.dtype),
        input_projection.to(device=a.device, dtype=a.dtype),
    )


def embed(features: Features, projections: tuple[Tensor, Tensor] | None, lr: float) -> Tensor:
    """One checkpoint's part of the random-projection embedding (n, d_out * d_in)."""
    g, a = features
    if projections is not None:
        g, a = g @ projections[0], a @ projections[1]
    outer = torch.matmul(torch.unsqueeze(g, 2), torch.unsqueeze(a, 1))
    return outer.flatten(start_dim=1) * lr**0.5
