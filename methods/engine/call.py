"""What a method receives (``Call``) and returns (``Output``), and the public ``Result``."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from methods.engine.batching import BatchSize
from methods.engine.inputs import Forward, Tensors
from methods.engine.targets import Target


@dataclass(frozen=True)
class Call:
    """One attribution request, normalised by the engine; methods read, never mutate, it."""

    method: str
    model: Any
    forward: Forward
    inputs: Tensors
    target: Target
    baselines: Any
    internal_batch_size: BatchSize = None
    perturbations_per_eval: BatchSize = None
    generator: torch.Generator | None = None
    return_delta: bool = False

    @property
    def n(self) -> int:
        return self.inputs[0].shape[0]  # a SymInt when traced (methods.export)

    def shape_key(self, *extra: Hashable) -> tuple[Hashable, ...]:
        """What a row's memory cost depends on: method, per-example shapes, dtypes, args."""
        xs = tuple((tuple(x.shape[1:]), x.dtype, x.device) for x in self.inputs)
        args = tuple(
            (tuple(a.shape[1:]), a.dtype) if isinstance(a, Tensor) else type(a).__name__
            for a in self.forward.args
        )
        return (self.method, xs, args, *extra)

    def shape_family(self, *extra: Hashable) -> tuple[tuple[Hashable, ...], int]:
        """``shape_key`` without the per-example sizes (only how many dims), and how many
        elements an example has (inputs and tensor args): inputs that differ only in size,
        as texts of other lengths, are one family (``batching.measured_once`` scales)."""
        tensors = [*self.inputs, *(a for a in self.forward.args if isinstance(a, Tensor))]
        xs = tuple((x.dim(), x.dtype, x.device) for x in self.inputs)
        args = tuple(
            (a.dim(), a.dtype) if isinstance(a, Tensor) else type(a).__name__
            for a in self.forward.args
        )
        size = sum(int(t[0].numel()) if t.dim() else 1 for t in tensors if t.shape[:1] != (0,))
        return (self.method, xs, args, *extra), max(1, size)

    def replace(self, **changes: Any) -> Call:
        return dataclasses.replace(self, **changes)

    def expanded(self, k: int) -> Call:
        """This call over ``k`` stacked copies of the batch: forward args and targets tiled."""
        forward, target = self.forward.expanded(k), self.target.expand(k)
        if forward is self.forward and target is self.target:
            return self  # nothing per-row to tile (the common case): no copy
        return self.replace(forward=forward, target=target)

    # torch.randn/rand/randint's own numbers (they fill an empty tensor the same way); unlike
    # them, the in-place fills take a symbolic size when traced (methods.export)
    def randn(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        return like.new_empty(shape).normal_(generator=self.generator)

    def rand(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        return like.new_empty(shape).uniform_(generator=self.generator)

    def randint(self, high: int, shape: tuple[int, ...], device: torch.device) -> Tensor:
        out = torch.empty(shape, dtype=torch.long, device=device)
        return out.random_(high, generator=self.generator)


@dataclass
class Output:
    """A method's answer. ``attributions`` is always a tuple here; the API restores the form."""

    attributions: Tensors
    delta: Tensor | None = None
    #: the targeted model output for each example (the value being attributed), if computed
    outputs: Tensor | None = None
    #: effective parameters decided at run time (chosen batch sizes, steps used, ...)
    echo: dict[str, Any] = field(default_factory=dict)
    #: for layer methods: whether the layer produced a tuple; None mirrors the inputs' form
    as_tuple: bool | None = None
    #: Shapley-family methods: the targeted output at the baselines, from the method's own
    #: empty coalition (``Result.base_values``)
    base: Tensor | None = None
    #: sampled Shapley methods: the attributions' standard error (one tensor per input)
    standard_error: Tensors | None = None
    #: the regions the answer credits, when the method draws them (XRAI's, ranked)
    segments: Tensor | None = None


@dataclass(frozen=True)
class Result:
    """The result of ``methods.attribute``."""

    #: a tensor, a tuple (one per input, or per tensor of the layer), or for a layer whose
    #: value nests tuples (an LSTM's ``out, (h, c)``) the same nesting; for a list of layers,
    #: a list of these, one per layer
    attributions: Tensor | tuple[Any, ...] | list[Any]
    #: one value per example; for a list of layers, a list of these, one per layer
    convergence_delta: Tensor | list[Tensor] | None
    #: the model's output at the target for each example, when the method computed it
    outputs: Tensor | None
    #: every effective parameter: defaults, chosen batch sizes, steps used
    params: dict[str, Any]
    method: str
    #: with a ``precision``: what it cost (``methods.engine.precision.Fidelity``)
    fidelity: Any = None
    #: the method's arguments as the caller gave them (its params, baselines, batch sizes,
    #: noise tunnel, seed), to run it again the same way (``methods.evaluate``)
    given: dict[str, Any] = field(default_factory=dict)
    #: Shapley-family methods: each example's targeted output at its baselines (their mean
    #: over a background set), on the attributed scale: ``sum(attributions) + base_values ==
    #: outputs`` where the method is exact (over features: a feature mask's group counts once)
    base_values: Tensor | None = None
    #: sampled Shapley methods: each attribution's standard error over the method's samples,
    #: shaped as the attributions (over a background set: the rows' weighted sum of theirs,
    #: an upper bound, the rows sharing their samples)
    standard_error: Any = None
    #: the targets the engine chose (``{"top_k": K}``: the classes per example, (N, K), best
    #: first); None where the caller's target stands
    target: Tensor | None = None
    #: the image regions the answer credits: the superpixels a ``{"superpixels": ...}`` mask
    #: made (the feature mask used, as the inputs'), or XRAI's regions ranked (``[N, H, W]``,
    #: 1 the most important); None otherwise
    segments: Any = None

    @property
    def steps(self) -> dict[str, Any] | None:
        """``n_steps="auto"`` (``steps_of``): the steps it stopped at, the evaluations it
        made and its error estimate; None for a fixed step count."""
        return steps_of(self.params)


def steps_of(params: dict[str, Any]) -> dict[str, Any] | None:
    """What ``n_steps="auto"`` took, from a result's effective ``params``: ``n_steps`` (the
    rung it stopped at), ``evaluations`` (forward/backward rows per example: the path's
    points, each computed once, and the two endpoints' forwards, f(inputs) and f(baselines))
    and ``error_estimate`` (the attributions' relative L2 change over the last rung); None
    where the step count was fixed."""
    if "n_steps_evaluated" not in params:
        return None
    change = params.get("change")
    return {
        "n_steps": int(params["n_steps"]),
        "evaluations": int(params["n_steps_evaluated"]) + 2,
        "error_estimate": None if change is None else float(change),
    }
