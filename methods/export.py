"""``methods.export``: an attribution step as a ``torch.export`` program.

``export(model, "saliency", x, target=3)`` returns a ``torch.export.ExportedProgram`` whose
``forward(*inputs)`` returns what ``methods.attribute(model, inputs, "saliency", target=3)
.attributions`` returns, for any batch size. ``torch.export.save`` writes it to one file;
``torch.export.load(...).module()(x)`` gives the heatmap with only torch installed.

How: ``methods.attribute`` itself is traced (one implementation, not a second one written for
export). ``make_fx`` records every aten op the call runs, the model's forward, autograd's
backward kernels and the engine's own rules (DeepLift, guided backprop and deconvolution
intercept the non-linearities, ``methods.engine.intercept``), over fake inputs whose batch
size is a symbol; the graph of plain aten ops is then exported with that dim dynamic
(``torch.export.Dim``). Whatever Python decides once per call (parameters, quadrature points,
the target's form) is baked in. A step that turns the batch size into a Python int (chunking
by ``internal_batch_size``, a loop over examples) would pin the graph to the example's batch:
such traces are refused, never returned, and so are results that differ from the eager call.

Targets: ``None``, an int or an index tuple are baked in (Captum's meaning). ``target="input"``
makes the class an input instead: the program's last argument is an int64 tensor ``(N,)``,
one class per example, for a model with outputs ``(N, C)`` (the per-example list form of
``methods.attribute``); out-of-range classes fail at run time.

Saving: ``save(program, path)`` (``from methods.export import save, load``) writes the
program with ``torch.export.save`` and a description of the step it computes (method,
effective params, target mode, input specs) as the archive's extra file ``attrserve.json``;
``load(path)`` reads both back, and the service serves such a file as
``source = "attribution-export:PATH"``.

Randomness (``gradient_shap``): the program draws from torch's default generator at every call,
as a model with dropout would; ``torch.manual_seed(s)`` before the call gives exactly
``methods.attribute(..., seed=s)``'s numbers on the CPU. A seed cannot be baked into the graph.
"""

from __future__ import annotations

import json
import os
import warnings
import weakref
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, fx, nn

from methods import registry
from methods.api import attribute
from methods.engine import quadrature
from methods.engine.inputs import format_inputs
from methods.errors import AttributionError, InvalidArgumentError, ModelError

__all__ = [
    "DESCRIPTION_FILE",
    "EXPORTABLE",
    "NotExportableError",
    "description",
    "export",
    "load",
    "read_description",
    "save",
]

#: the methods whose whole computation is a fixed graph of tensor ops over the batch
EXPORTABLE: frozenset[str] = frozenset(
    {
        "saliency",
        "input_x_gradient",
        "integrated_gradients",
        "gradient_shap",
        "deeplift",
        "guided_backprop",
        "deconvolution",
        "layer_gradcam",
        "layer_integrated_gradients",
    }
)

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

#: the per-call class input (``target="input"``)
TARGET_INPUT = "input"
#: the extra file of a saved program that describes its step (``save``, ``load``)
DESCRIPTION_FILE = "attrserve.json"
#: the description's format (bumped when a key changes meaning)
DESCRIPTION_FORMAT = 1
#: arguments of ``methods.attribute`` that are not the method's own params
_CALL_ARGUMENTS = ("baselines", "additional_forward_args")
#: what ``export`` knows of each program it returned, for ``save``
_DESCRIPTIONS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


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
    _check_exportable(method, spec.kind, params)
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
    _DESCRIPTIONS[program] = _describe(model, method, target, params, xs, step.n_classes)
    return program


def _check_exportable(method: str, kind: str, params: dict[str, Any]) -> None:
    if method not in EXPORTABLE:
        why = _WHY_NOT.get(kind, f"{method} is not among the exportable methods")
        raise NotExportableError(
            f"{method} cannot be exported: {why}. Exportable: {', '.join(sorted(EXPORTABLE))}",
            argument="method",
        )
    for name, why in _REFUSED.items():
        value = params.get(name)
        if value is not None and value is not False:
            raise NotExportableError(f"export does not take {name}={value!r}: {why}", argument=name)
        params.pop(name, None)
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


# -- saving with a description ------------------------------------------------------------


def _json_value(value: Any) -> Any:
    """A param as JSON: tensors by their dtype and shape (the values stay in the graph)."""
    if isinstance(value, Tensor):
        if value.numel() == 1:
            return value.item()
        dtype = str(value.dtype).removeprefix("torch.")
        return {"tensor": {"dtype": dtype, "shape": list(value.shape)}}
    if isinstance(value, (tuple, list)):
        return [_json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return {"python": type(value).__name__}


def _describe(
    model: Any,
    method: str,
    target: Any,
    params: dict[str, Any],
    xs: tuple[Tensor, ...],
    n_classes: int,
) -> dict[str, Any]:
    """What a server needs to know of a program: the step it computes and what it takes."""
    spec = registry.get(method)
    own = {k: v for k, v in params.items() if k not in _CALL_ARGUMENTS}
    from methods.params import parse_params

    effective = parse_params(spec.params, method, dict(own))
    extra = params.get("additional_forward_args")
    extra = () if extra is None else extra if isinstance(extra, tuple) else (extra,)
    output: list[int] | None = None
    try:
        with torch.no_grad():
            out = model(*xs, *extra)
        if isinstance(out, Tensor):
            output = [int(d) for d in out.shape[1:]]
    except Exception:  # the program is already checked; the output shape is a courtesy
        output = None
    if isinstance(target, Tensor):
        target = target.item()
    return {
        "format": DESCRIPTION_FORMAT,
        "method": method,
        "params": _json_value(effective.model_dump()),
        "given_params": sorted(own),
        "target": TARGET_INPUT if n_classes else _json_value(target),
        "n_classes": n_classes or None,
        "baselines": _json_value(params.get("baselines")),
        "additional_forward_args": extra != (),
        "inputs": [
            {"dtype": str(x.dtype).removeprefix("torch."), "shape": [None, *x.shape[1:]]}
            for x in xs
        ],
        "output_shape": output,
        "torch": torch.__version__,
    }


def description(program: Any) -> dict[str, Any] | None:
    """The description ``export`` (or ``load``) recorded for ``program``; None if neither did."""
    try:
        return _DESCRIPTIONS.get(program)
    except TypeError:  # not weak-referenceable: not ours
        return None


def save(
    program: torch.export.ExportedProgram,
    path: str | os.PathLike[str],
    /,
    describe: dict[str, Any] | None = None,
) -> None:
    """``torch.export.save(program, path)`` with the step's description as the extra file
    ``attrserve.json`` (what a server reads to know the method, params and target mode).

    ``describe`` overrides the description ``export`` recorded; a program that ``export`` did
    not make needs one (at least ``{"method": ...}``)."""
    desc = describe if describe is not None else description(program)
    if desc is None or not isinstance(desc.get("method"), str):
        raise InvalidArgumentError(
            "this program was not made by methods.export (or loaded with methods.export.load), "
            'so its step is unknown: pass describe={"method": ..., "params": {...}, "target": '
            "...}",
            argument="program",
        )
    text = json.dumps(desc, sort_keys=True)
    torch.export.save(program, path, extra_files={DESCRIPTION_FILE: text})


def _parse(text: str, where: str) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        desc = json.loads(text)
    except ValueError as exc:
        raise InvalidArgumentError(
            f"{where}: {DESCRIPTION_FILE} is not valid JSON: {exc}", argument="path"
        ) from None
    if not isinstance(desc, dict) or not isinstance(desc.get("method"), str):
        raise InvalidArgumentError(
            f"{where}: {DESCRIPTION_FILE} must be an object naming the method", argument="path"
        )
    return desc


def load(
    path: str | os.PathLike[str],
) -> tuple[torch.export.ExportedProgram, dict[str, Any] | None]:
    """A saved program and its description (None when it was saved without one)."""
    extra = {DESCRIPTION_FILE: ""}
    program = torch.export.load(path, extra_files=extra)
    desc = _parse(extra[DESCRIPTION_FILE], str(path))
    if desc is not None:
        _DESCRIPTIONS[program] = desc
    return program, desc


def read_description(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The description in a saved program's archive, without loading the program (a server
    reads it at start-up to validate requests before any worker has loaded the file). None
    when the file has none. Raises InvalidArgumentError when the file is no .pt2 archive."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(f"/extra/{DESCRIPTION_FILE}")]
            text = archive.read(names[0]).decode("utf-8") if names else ""
    except (OSError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise InvalidArgumentError(
            f"{str(path)!r} is not a program saved with torch.export.save: {exc}",
            argument="path",
        ) from None
    return _parse(text, str(path))
