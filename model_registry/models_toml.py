"""Parse a models.toml into ModelSpecs, strictly: unknown keys, wrong types and duplicate ids
are errors that name the file, the model and the field, and say what was expected.

The format (the README's Models section has the full reference)::

    [[models]]
    id = "churn"
    source = "python:mypkg.models:make_churn"   # or builtin:NAME, torchscript:PATH, export:PATH,
                                                 # attribution-export:PATH, hf:DIRECTORY
    weights = "weights/churn.safetensors"        # python: and builtin: sources only
    labels = ["stays", "leaves"]
    layers = ["fc1"]
    inputs = [{ name = "x", dtype = "float32", shape = ["N", 12] }]

TOML has no null, so a free dim is written as a string (its name: "N", "L", ...); dim 0 is the
batch and must be free. ``output_shape`` is per example (no batch dim) and defaults to
``[len(labels)]``. Relative paths are taken from the directory of the models.toml.

This module reads the file and the ``[[models]]`` array and checks the keys of each table;
the table's source (``sources.SOURCES``) builds its spec, reading the keys through a
``table.Table``, with the keys of the model's task read by its ``tasks.Task``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from model_registry import influence
from model_registry.errors import RegistryError
from model_registry.sources import SOURCES, parse_source
from model_registry.spec import ModelSpec
from model_registry.table import ID, Table, describe_value
from model_registry.tasks import INFLUENCE, task_of

#: keys every model may give (sources add their own: ``ModelSource.own_keys``)
MODEL_KEYS = (
    "id",
    "version",
    "description",
    "source",
    "weights",
    "device",
    "dtype",
    "inputs",
    "labels",
    "output_shape",
    "layers",
    "embedding_layer",
    "internal_batch_size",
    "perturbations_per_eval",
    "explain",
    "defaults",
    "kind",
    "compile",
    "compile_mode",
    "verify_device",
    "precision",
    "fidelity_sample",
    "fidelity_tolerance",
    "group",
    "workers",
    "influence",
    "background",
    "background_kmeans",
)


def load_file(path: str | Path) -> list[ModelSpec]:
    """Read and validate the models.toml at ``path``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise RegistryError(f"cannot read the models file: {e.strerror or e}", file=str(p)) from e
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise RegistryError(f"not valid TOML: {e}", file=str(p)) from e
    return parse(doc, file=str(p), base_dir=str(p.resolve().parent))


def parse(
    doc: dict[str, Any], file: str = "<models.toml>", base_dir: str | None = None
) -> list[ModelSpec]:
    """Validate an already-decoded models.toml document."""
    extra = sorted(set(doc) - {"models"})
    if extra:
        raise RegistryError(
            f"unknown top-level key(s) {extra}; expected only the [[models]] array", file=file
        )
    models = doc.get("models")
    if not isinstance(models, list) or not models:
        raise RegistryError(
            "expected a non-empty [[models]] array (one [[models]] table per served model), "
            f"got {describe_value(models)}",
            file=file,
            field="models",
        )
    specs: list[ModelSpec] = []
    seen: dict[str, int] = {}
    for i, data in enumerate(models):
        spec = parse_model(data, file, i, base_dir)
        if spec.id in seen:
            raise RegistryError(
                f"duplicate id; already declared by models[{seen[spec.id]}]",
                file=file,
                model=spec.id,
                index=i,
                field="id",
            )
        seen[spec.id] = i
        specs.append(spec)
    check_groups(specs, file)
    return specs


def check_groups(specs: list[ModelSpec], file: str) -> None:
    """Models of one group agree on its ``workers`` (given by one of them, or all alike)."""
    workers: dict[str, tuple[int, int]] = {}
    for i, spec in enumerate(specs):
        name = spec.group_name
        if spec.workers is None:
            continue
        first = workers.setdefault(name, (spec.workers, i))
        if first[0] != spec.workers:
            raise RegistryError(
                f"workers = {spec.workers}, but models[{first[1]}] gives group {name!r} "
                f"workers = {first[0]}; give it once, or alike",
                file=file,
                model=spec.id,
                index=i,
                field="workers",
            )


def parse_model(data: object, file: str, index: int, base_dir: str | None) -> ModelSpec:
    """One ``[[models]]`` table: its id and keys checked, then its source builds the spec."""
    if not isinstance(data, dict):
        raise RegistryError(f"expected a table, got {describe_value(data)}", file=file, index=index)
    table = Table(data, file, index, base_dir)
    table.id = table.string("id", required=True, pattern=ID, hint="letters, digits, . _ -")
    own = {key: [s for s in SOURCES.values() if key in s.own_keys] for key in data}
    unknown = sorted(key for key in data if key not in MODEL_KEYS and not own[key])
    if unknown:
        known = [*MODEL_KEYS, *(k for s in SOURCES.values() for k in s.own_keys)]
        table.fail(unknown[0], f"unknown key(s) {unknown}; expected some of {known}")
    text = table.string("source", required=True) or ""
    try:
        source = parse_source(text)
    except ValueError as e:
        table.fail("source", str(e))
    found = SOURCES[source.name]
    if found.path_target:
        table.inside(source.target, "source")
    for key, owners in own.items():
        if owners and found not in owners:
            takers = ", ".join(f"{s.name}:" for s in owners)
            table.fail(key, f"only {takers} sources take {key!r}")
    spec = found.spec(table, source)
    found_influence = influence.parse(table)
    if found_influence is None:
        return spec
    task = task_of(spec)
    if not task.supports(INFLUENCE):
        table.fail("influence", f"influence is served for models of tensors, not {task.name}")
    return dataclasses.replace(spec, influence=found_influence)
