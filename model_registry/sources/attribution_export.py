"""``attribution-export:PATH``: a program saved by ``methods.export.save`` whose forward
returns the attributions of one method; the model serves that method only.

The file's description (``attrserve.json``) supplies the method, the baked params and target,
and the inputs; models.toml may add labels and a device, or, for a file saved without a
description, name the method and declare the inputs."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import torch
from torch.export.passes import move_to_device_pass

from methods.errors import InvalidArgumentError
from methods.export import load as load_program
from methods.export import read_description
from model_registry.checks import declared_shapes, existing_file, zeros
from model_registry.errors import RegistryError
from model_registry.sources.base import FileSource, Source, register
from model_registry.spec import (
    MODEL_DTYPES,
    ExportedStep,
    InputSpec,
    LoadedModel,
    ModelSpec,
    OutputSpec,
)
from model_registry.table import Table, dims_text

#: keys an attribution-export model does not take, and why
_NOT_FOR_PROGRAM = {
    "weights": "the file carries its own weights",
    "layers": "the file computes one attribution; it has no layers to choose from",
    "embedding_layer": "the file computes one attribution; it has no layers to choose from",
    "explain": "the file returns attributions, not predictions, so it has no :explain",
    "internal_batch_size": "the program evaluates a whole batch at once",
    "perturbations_per_eval": "the program evaluates a whole batch at once",
    "compile": "the file is already one graph of aten operations; compile eager models",
    "compile_mode": "the file is already one graph of aten operations; compile eager models",
    "verify_device": "the file holds only the attribution step, no model to compare it with "
    "in float64",
}


@register
class AttributionExportSource(FileSource):
    name = "attribution-export"
    syntax = "attribution-export:PATH"
    own_keys = ("method",)
    refused = MappingProxyType(
        {k: f"not for attribution-export: sources: {why}" for k, why in _NOT_FOR_PROGRAM.items()}
    )

    def spec(self, table: Table, source: Source) -> ModelSpec:
        self.validate(table, source)
        self.task(table, source)
        table.refuse(self.refused)
        try:
            desc = read_description(source.path(table.base_dir))
        except InvalidArgumentError as e:
            table.fail("source", str(e))
        method = table.string("method")
        if desc is None and method is None:
            table.fail(
                "method",
                "the file has no attrserve.json description (it was saved with "
                "torch.export.save, not methods.export.save): name the method it computes "
                '(method = "saliency"), and declare inputs and labels or output_shape',
            )
        if desc is not None and method is not None and method != desc["method"]:
            table.fail("method", f"the file computes {desc['method']!r}, not {method!r}")
        inputs = _inputs(table, desc)
        floats = [i.dtype for i in inputs if i.dtype in MODEL_DTYPES]
        fixed = floats[0] if floats else None
        dtype = table.choice("dtype", MODEL_DTYPES, fixed or "float32")
        if fixed is not None and dtype != fixed:
            table.fail("dtype", f"the program computes in {fixed}; its dtypes are fixed")
        labels = table.labels()
        shape = _output_shape(table, desc, labels)
        step = _step(table, desc, method)
        if step.per_example_target and shape != ((desc or {}).get("n_classes"),):
            table.fail(
                "labels" if labels else "output_shape",
                f"the program takes one class per example out of {desc and desc['n_classes']}",
            )
        return ModelSpec(
            **table.common(description=f"{step.method} (attribution-export)"),
            dtype=dtype,
            inputs=inputs,
            output=OutputSpec(shape=shape, labels=labels),
            exported=step,
        )

    def load(self, spec: ModelSpec, source: Source, device: torch.device) -> LoadedModel:
        path = existing_file(source.path(spec.base_dir), spec, "source")
        try:
            program, desc = load_program(str(path))
        except Exception as e:
            raise RegistryError(
                f"{str(path)!r} is not a loadable attribution program (saved with "
                f"methods.export.save or torch.export.save): {e}",
                model=spec.id,
                field="source",
            ) from e
        step = spec.exported
        if step is None or (desc is not None and desc.get("method") != step.method):
            raise RegistryError(
                f"the file computes {desc and desc.get('method')!r}, the model was configured "
                f"for {step and step.method!r} (was the file replaced?)",
                model=spec.id,
                field="source",
            )
        if device.type != "cpu":
            program = move_to_device_pass(program, device)
        loaded = LoadedModel(
            spec=spec,
            model=program.module(),
            device=device,
            extra={"source_kind": self.name, "exported": step},
        )
        _check_program(loaded)
        return loaded


def _inputs(table: Table, desc: dict[str, Any] | None) -> tuple[InputSpec, ...]:
    """The inputs models.toml declares, which must match the file's, or the file's."""
    declared = table.inputs() if "inputs" in table or desc is None else None
    described = _described_inputs(table, desc) if desc is not None else None
    if declared is not None and described is not None:
        mismatch = [
            (j, d, f)
            for j, (d, f) in enumerate(zip(declared, described, strict=False))
            if d.dtype != f.dtype or d.shape != f.shape
        ]
        if len(declared) != len(described) or mismatch:
            table.fail(
                "inputs",
                "the file's program takes "
                + ", ".join(f"{f.dtype}{dims_text(f.shape)}" for f in described)
                + "; declared "
                + ", ".join(f"{d.dtype}{dims_text(d.shape)}" for d in declared),
            )
    inputs = declared if declared is not None else described
    if inputs is None:  # one of the two is set whenever desc is None or not
        table.fail("inputs", "required")
    return inputs


def _described_inputs(table: Table, desc: dict[str, Any]) -> tuple[InputSpec, ...]:
    raw = desc.get("inputs")
    if not isinstance(raw, list) or not raw:
        table.fail("source", "the file's description has no inputs; declare inputs")
    try:
        return tuple(
            InputSpec(
                f"x{j}" if len(raw) > 1 else "x",
                str(i["dtype"]),
                tuple(None if d is None else int(d) for d in i["shape"]),
            )
            for j, i in enumerate(raw)
        )
    except (TypeError, KeyError, ValueError):
        table.fail("source", "the file's description has no valid inputs; declare inputs")


def _output_shape(
    table: Table, desc: dict[str, Any] | None, labels: tuple[str, ...]
) -> tuple[int | None, ...]:
    out_shape = (desc or {}).get("output_shape")
    if "output_shape" in table:
        shape = table.output_shape()
    elif labels:
        shape = (len(labels),)
    elif isinstance(out_shape, list):
        shape = tuple(out_shape)
    else:
        table.fail("output_shape", "required when there are no labels")
    if labels and shape != (len(labels),):
        table.fail("labels", f"{len(labels)} labels for a model output {list(shape)}")
    if isinstance(out_shape, list) and shape != tuple(out_shape):
        field = "labels" if labels and "output_shape" not in table else "output_shape"
        table.fail(field, f"the file's model gives {out_shape} per example, not {list(shape)}")
    return shape


def _step(table: Table, desc: dict[str, Any] | None, method: str | None) -> ExportedStep:
    if desc is None:
        if method is None:  # spec already reported it; this narrows the type
            table.fail("method", "is required")
        return ExportedStep(method=method, described=False)
    target = desc.get("target")
    params = desc.get("params")
    return ExportedStep(
        method=str(desc["method"]),
        params=params if isinstance(params, dict) else None,
        target=tuple(target) if isinstance(target, list) else target,
        baselines=desc.get("baselines"),
    )


def _check_program(loaded: LoadedModel) -> None:
    """Run two examples of zeros through an attribution program (with class 0 each, when it
    takes the classes), so a wrong declaration fails at start-up."""
    spec, step = loaded.spec, loaded.spec.exported
    xs = zeros(loaded)
    if step is None or xs is None:
        return
    if step.per_example_target:
        xs.append(torch.zeros(2, dtype=torch.int64, device=loaded.device))
    try:
        with torch.no_grad():
            loaded.model(*xs)
    except Exception as e:
        raise RegistryError(
            f"the program fails on zeros shaped as declared ({declared_shapes(spec)}): "
            f"{type(e).__name__}: " + " ".join(str(e).split())[:500],
            model=spec.id,
            field="inputs",
        ) from e
