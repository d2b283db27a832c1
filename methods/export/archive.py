"""A program's description, and saving and loading it with one (``attrserve.json``).

A server needs to know, before loading a program, what step it computes: the method, its
effective params, whether the classes are baked in or given per call, the inputs it takes.
``export`` records that here for every program it returns; ``save`` writes it into the
archive as an extra file, ``load`` and ``read_description`` read it back.
"""

from __future__ import annotations

import json
import os
import weakref
import zipfile
from typing import Any

import torch
from torch import Tensor

from methods import registry
from methods.errors import InvalidArgumentError
from methods.params import parse_params

__all__ = [
    "DESCRIPTION_FILE",
    "DESCRIPTION_FORMAT",
    "TARGET_INPUT",
    "describe",
    "description",
    "load",
    "read_description",
    "remember",
    "save",
]

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


def describe(
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


def remember(program: Any, desc: dict[str, Any]) -> None:
    """Keep ``desc`` as what ``program`` computes, for ``save`` and ``description``."""
    _DESCRIPTIONS[program] = desc


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
        remember(program, desc)
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
