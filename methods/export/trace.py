"""Tracing and exporting: ``methods.attribute`` as one aten graph over a symbolic batch.

What is exported and how is told in the package docstring (``methods.export``); this module
holds the checks (which methods and arguments can become a fixed graph), the step as a module,
the trace with a symbolic batch size and the comparison with the eager call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, fx, nn

from methods import registry
from methods.api import EXPORTING, attribute
from methods.engine import quadrature
from methods.engine.inputs import format_inputs
from methods.errors import AttributionError, InvalidArgumentError, ModelError
from methods.export.archive import TARGET_INPUT, describe, remember

__all__ = ["EXPORTABLE", "NotExportableError", "export"]

#: the methods whose whole computation is a fixed graph of tensor ops over the batch
#: (``MethodSpec.exportable``)
EXPORTABLE: frozenset[str] = frozenset(s.name for s in registry.specs() if s.exportable)

#: ``methods.attribute`` arguments export does not take, and why
_REFUSED: dict[str, str] = {
    "internal_batch_size": "the program evaluates every step of a call at once; chunking by "
    "rows would fix the graph to one batch size (call it with smaller batches instead)",
    "perturbations_per_eval": "no exportable method perturbs its inputs",
    "noise_tunnel": "the noise tunnel is not exported; export the method and average calls",
    "seed": "a seed cannot be baked into a graph; the program draws from torch's default "
    "generator, so call torch.manual_seed(seed) before it",
    "return_convergence_delta": "the program returns the attributions only",
}

_WHY_NOT: dict[str, str] = {
    "perturbation": "a perturbation method's work (feature groups, windows, samples) is "
    "chosen in Python for each call, partly from the input values, so it is no fixed graph "
    "of tensor operations",
    "neuron": "neuron methods are not exportable yet",
}


class NotExportableError(InvalidArgumentError):
    """The method, or one of its arguments, cannot become a fixed graph over a dynamic batch;
    the message says why (``argument`` names the argument at fault)."""


def export(
    model: Any,
    method: str,
    example_inputs: Any,
    /,
    target: Any = None,
    **params: Any,
) -> torch.export.ExportedProgram:
    """A ``torch.export`` program computing ``method``'s attributions for any batch size.

    ``example_inputs`` (a tensor or a tuple) fix everything but the batch size: dtypes,
    devices and the other dims. ``target`` is baked in (None, an int, an index tuple), or
    ``"input"``: the program then takes one int64 class per example after the inputs.
    ``params`` are ``methods.attribute``'s (baselines, method parameters, additional forward
    arguments, baked in as constants). The program is checked against the eager call on the
    example inputs before it is returned. Raises ``NotExportableError`` saying why where the
    method or an argument cannot be exported.
    """
    spec = registry.get(method)  # unknown names get the engine's error and suggestions
    _check_exportable(method, spec.family, params)
    xs, as_tuple = format_inputs(example_inputs)
    xs = tuple(x.detach() for x in xs)
    if xs[0].shape[0] == 1:  # a traced size of 1 is specialised by torch: trace two rows
        xs = tuple(torch.cat([x, x]) for x in xs)
    per_example = isinstance(target, str) and target == TARGET_INPUT
    if not per_example:
        _check_target(target)
    step = _Step(model, method, as_tuple, target, params, per_example, xs)
    if per_example:  # every class in turn, as the example's classes
        classes = torch.arange(xs[0].shape[0], device=xs[0].device) % step.n_classes
        args: tuple[Tensor, ...] = (*xs, classes)
    else:
        args = xs
    with torch.random.fork_rng(devices=_cuda_devices(args)):
        torch.manual_seed(0)
        expected = step(*args)  # eager: the reference, and warms the engine's caches
        traced = _trace(step, args, method)
        program = _export(traced, args, method)
        torch.manual_seed(0)
        got = program.module()(*args)
    _check_equal(got, expected, method)
    remember(program, describe(model, method, target, params, xs, step.n_classes))
    return program


def _check_exportable(method: str, family: str, params: dict[str, Any]) -> None:
    if method not in EXPORTABLE:
        why = _WHY_NOT.get(family, f"{method} is not among the exportable methods")
        raise NotExportableError(
            f"{method} cannot be exported: {why}. Exportable: {', '.join(sorted(EXPORTABLE))}",
            argument="method",
        )
    for name, why in _REFUSED.items():
        value = params.get(name)
        if value is not None and value is not False:
            raise NotExportableError(f"export does not take {name}={value!r}: {why}", argument=name)
        params.pop(name, None)
    if isinstance(params.get("layer"), (list, tuple)):
        raise NotExportableError(
            "export takes one layer: an exported program computes one attribution; export "
            "one program per layer",
            argument="layer",
        )
    if params.get("n_steps") == "auto":
        raise NotExportableError(
            "n_steps='auto' decides in Python, from the values, how many steps to take; "
            "export a fixed n_steps",
            argument="n_steps",
        )


def _check_target(target: Any) -> None:
    if isinstance(target, (list, Tensor)) and not (
        isinstance(target, Tensor) and target.numel() == 1
    ):
        raise NotExportableError(
            "a per-example target is fixed to one batch; pass target='input' to give the "
            "classes at each call, or an int / index tuple to bake one in",
            argument="target",
        )


class _Step(nn.Module):
    """``methods.attribute`` as a function of the inputs (and the per-example classes)."""

    def __init__(
        self,
        model: Any,
        method: str,
        as_tuple: bool,
        target: Any,
        params: dict[str, Any],
        per_example: bool,
        xs: tuple[Tensor, ...],
    ) -> None:
        super().__init__()
        self.method, self.as_tuple, self.target, self.params = method, as_tuple, target, params
        self.per_example = per_example
        self.model = model
        self.n_classes = 0
        if per_example:
            self.n_classes = _n_classes(model, xs, params.get("additional_forward_args"))
            self.selector = _Selected(model)

    def forward(self, *args: Tensor) -> Any:
        token = EXPORTING.set(True)
        try:
            return self._attribute(*args)
        finally:
            EXPORTING.reset(token)

    def _attribute(self, *args: Tensor) -> Any:
        if not self.per_example:
            inputs = args if self.as_tuple else args[0]
            return attribute(
                self.model, inputs, self.method, target=self.target, **self.params
            ).attributions
        *xs, classes = args
        torch._assert_async(
            ((classes >= 0) & (classes < self.n_classes)).all(),
            f"target: every class must be in [0, {self.n_classes})",
        )
        onehot = (classes.unsqueeze(1) == torch.arange(self.n_classes, device=xs[0].device)).to(
            _float_dtype(xs)
        )
        params = dict(self.params)
        extra = params.pop("additional_forward_args", None)
        extra = () if extra is None else extra if isinstance(extra, tuple) else (extra,)
        if "layer" in params:  # the model sits one level down in the selector
            params["layer"] = f"model.{params['layer']}"
        inputs = tuple(xs) if self.as_tuple else xs[0]
        return attribute(
            self.selector, inputs, self.method, additional_forward_args=(*extra, onehot), **params
        ).attributions


class _Selected(nn.Module):
    """The model's ``(N, C)`` output reduced to each example's class by a one-hot mask.

    ``(out * onehot).sum(1)`` equals ``out[i, t_i]`` exactly (the other terms are exact
    zeros), and its backward seeds the model's output with the same one-hot tensor a
    per-example target does, so the attributions are the same numbers.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any) -> Tensor:
        *rest, onehot = args
        out = self.model(*rest)
        return (out * onehot).sum(1)


def _n_classes(model: Any, xs: tuple[Tensor, ...], extra: Any) -> int:
    extra = () if extra is None else extra if isinstance(extra, tuple) else (extra,)
    with torch.no_grad():
        out = model(*xs, *extra)
    if not isinstance(out, Tensor) or out.dim() != 2:
        shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise NotExportableError(
            f"target='input' takes one class per example of a model output (N, C); this "
            f"model returns {shape}",
            argument="target",
        )
    return int(out.shape[1])


def _float_dtype(xs: Any) -> torch.dtype:
    for x in xs:
        if x.is_floating_point():
            return x.dtype
    return torch.get_default_dtype()


def _cuda_devices(args: tuple[Tensor, ...]) -> list[int]:
    return sorted({a.device.index or 0 for a in args if a.device.type == "cuda"})


@contextmanager
def _engine_caches_kept() -> Iterator[None]:
    """Tensors the engine caches while tracing would be fake ones: drop any made meanwhile.

    The eager reference call builds the cached tensors first, so this rarely clears anything.
    """
    before = quadrature.rule_tensors.cache_info().currsize
    try:
        yield
    finally:
        if quadrature.rule_tensors.cache_info().currsize != before:
            quadrature.rule_tensors.cache_clear()


def _trace(step: _Step, args: tuple[Tensor, ...], method: str) -> fx.GraphModule:
    """The aten graph of ``step`` over ``args`` with dim 0 a symbol (the batch size)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = [
        mode.from_tensor(
            a,
            symbolic_context=StatelessSymbolicContext(
                dynamic_sizes=[DimDynamic.DYNAMIC] + [DimDynamic.STATIC] * (a.dim() - 1)
            ),
        )
        for a in args
    ]
    try:
        with _engine_caches_kept(), mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            graph = make_fx(step, tracing_mode="real", _allow_non_fake_inputs=True)(*fakes)
    except AttributionError as exc:
        cause = exc.__cause__ if isinstance(exc, ModelError) else exc
        raise NotExportableError(
            f"{method} could not be traced with a symbolic batch size: {cause}",
            argument="model" if isinstance(exc, ModelError) else exc.argument,
        ) from exc
    for node in graph.graph.nodes:
        if node.op == "placeholder":
            size = node.meta["val"].shape[0]
            if not isinstance(size, torch.SymInt):
                raise NotExportableError(
                    f"tracing {method} turned the batch size into the constant {size}: a step "
                    "of the model or of the engine reads it as a Python int (e.g. int(x.shape"
                    "[0]), a loop over examples), so the graph would only fit that batch",
                    argument="model",
                )
    _own_constants(graph)
    return graph


def _own_constants(graph: fx.GraphModule) -> None:
    """Copy the tensors the trace captured (the model's weights as parameters, the engine's
    constants as buffers), so the program never aliases the caller's model: training the
    model later leaves the program as exported."""
    for name, p in list(graph.named_parameters(recurse=False)):
        setattr(graph, name, nn.Parameter(p.detach().clone(), requires_grad=False))
    for name, b in list(graph.named_buffers(recurse=False)):
        graph.register_buffer(name, b.detach().clone())


class _Program(nn.Module):
    def __init__(self, graph: fx.GraphModule) -> None:
        super().__init__()
        self.graph_module = graph

    def forward(self, *args: Tensor) -> Any:
        return self.graph_module(*args)


def _export(
    graph: fx.GraphModule, args: tuple[Tensor, ...], method: str
) -> torch.export.ExportedProgram:
    batch = torch.export.Dim("batch", min=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.export.export(
                _Program(graph), args, dynamic_shapes=(tuple({0: batch} for _ in args),)
            )
    except Exception as exc:  # torch's own report: which guard pinned the batch, and where
        raise NotExportableError(
            f"{method}'s traced graph does not hold for every batch size: {exc}",
            argument="model",
        ) from exc


def _flat(v: Any) -> list[Tensor]:
    if isinstance(v, Tensor):
        return [v]
    return [t for item in v for t in _flat(item)]


def _check_equal(got: Any, expected: Any, method: str) -> None:
    for g, e in zip(_flat(got), _flat(expected), strict=True):
        tol = 1e3 * torch.finfo(e.dtype).eps if e.is_floating_point() else 0.0
        scale = float(e.abs().max()) if e.numel() else 0.0
        if g.shape != e.shape or not torch.allclose(g, e, rtol=tol, atol=tol * max(scale, 1e-30)):
            raise NotExportableError(
                f"the exported {method} program disagrees with methods.attribute on the "
                "example inputs; the model probably runs Python that depends on values "
                "(branches on tensors, host-side randomness), which a graph cannot hold",
                argument="model",
            )
