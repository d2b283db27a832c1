"""Parse a models.toml into ModelSpecs, strictly: unknown keys, wrong types and duplicate ids
are errors that name the file, the model and the field, and say what was expected.

The format (the README's Models section has the full reference)::

    [[models]]
    id = "churn"
    source = "python:mypkg.models:make_churn"   # or builtin:NAME, torchscript:PATH, export:PATH,
                                                 # hf:DIRECTORY (with kind = "causal_lm")
    weights = "weights/churn.safetensors"        # python: and builtin: sources only
    labels = ["stays", "leaves"]
    layers = ["fc1"]
    inputs = [{ name = "x", dtype = "float32", shape = ["N", 12] }]

TOML has no null, so a free dim is written as a string (its name: "N", "L", ...); dim 0 is the
batch and must be free. ``output_shape`` is per example (no batch dim) and defaults to
``[len(labels)]``. Relative paths are taken from the directory of the models.toml.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from model_registry import builtin
from model_registry.errors import RegistryError
from model_registry.sources import (
    DEVICE,
    FILE_KINDS,
    INPUT_DTYPES,
    MODEL_DTYPES,
    Source,
    parse_source,
    resolve_path,
)
from model_registry.spec import (
    COMPILE_MODES,
    ExplainSpec,
    ExportedStep,
    InputSpec,
    ModelSpec,
    OutputSpec,
)

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
    "kind",
    "compile",
    "compile_mode",
    "verify_device",
    "method",
)
#: what a model is: tensors in and one output ("tensor"), or a generative language model
MODEL_KINDS = ("tensor", "causal_lm")
#: keys a causal_lm model does not take: its inputs are prompts, its output the next token
NOT_FOR_LM = (
    "inputs",
    "labels",
    "output_shape",
    "explain",
    "compile",
    "compile_mode",
    "verify_device",
)
#: keys an attribution-export model does not take, and why
NOT_FOR_PROGRAM = {
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
INPUT_KEYS = ("name", "dtype", "shape")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # safe in a URL path segment
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LAYER = re.compile(r"^[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")


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
            f"got {_kind(models)}",
            file=file,
            field="models",
        )
    specs: list[ModelSpec] = []
    seen: dict[str, int] = {}
    for i, table in enumerate(models):
        spec = _Model(file, i, base_dir).parse(table)
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
    return specs


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("N" if d is None else str(d) for d in shape) + "]"


def _kind(v: object) -> str:
    if v is None:
        return "nothing"
    kinds = {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}
    kinds |= {int: "an integer", float: "a float"}
    name = kinds.get(type(v), type(v).__name__)
    return name if isinstance(v, (dict, list)) else f"{name} {v!r}"


class _Model:
    """Parses one [[models]] table; remembers where it is, for the error messages."""

    def __init__(self, file: str, index: int, base_dir: str | None) -> None:
        self.file, self.index, self.base_dir = file, index, base_dir
        self.id: str | None = None

    def fail(self, field: str | None, message: str) -> NoReturn:
        raise RegistryError(
            message, file=self.file, model=self.id, index=self.index, field=field
        ) from None

    def parse(self, t: object) -> ModelSpec:
        if not isinstance(t, dict):
            self.fail(None, f"expected a table, got {_kind(t)}")
        model_id = self.string(t, "id", required=True, pattern=_ID, hint="letters, digits, . _ -")
        if model_id is None:  # required=True already reported it; this narrows the type
            self.fail("id", "is required")
        self.id = model_id
        unknown = sorted(set(t) - set(MODEL_KEYS))
        if unknown:
            self.fail(unknown[0], f"unknown key(s) {unknown}; expected some of {list(MODEL_KEYS)}")
        source = self.source(t)
        base = builtin.BUILTINS[source.target].spec() if source.kind == "builtin" else None
        if self.kind(t, source, base) == "causal_lm":
            return self.causal_lm(t, model_id, source, base)
        if "method" in t and source.kind != "attribution-export":
            self.fail("method", "only attribution-export: sources take a method")
        if source.kind == "attribution-export":
            return self.attribution_export(t, model_id, source)
        dtype = self.choice(t, "dtype", MODEL_DTYPES, base.dtype if base else "float32")
        if "inputs" in t or base is None:
            inputs = self.inputs(t)
        else:  # a built-in's own inputs, following a dtype override for its float inputs
            inputs = tuple(
                replace(i, dtype=dtype) if i.dtype in MODEL_DTYPES else i for i in base.inputs
            )
        labels = self.labels(t) if "labels" in t or base is None else base.output.labels
        if "output_shape" in t:
            shape = self.dims(t["output_shape"], "output_shape", batch=False)
        elif labels:
            shape = (len(labels),)
        elif base is not None and "labels" not in t:
            shape = base.output.shape
        else:
            self.fail(
                "output_shape",
                "required when there are no labels (per example, no batch "
                "dim; e.g. [] for one scalar per example)",
            )
        if labels and shape != (len(labels),):
            self.fail(
                "output_shape",
                f"with {len(labels)} labels the output must be [{len(labels)}] per example, "
                f"got {list(shape)}",
            )
        layers = self.layers(t) if "layers" in t or base is None else base.layers
        embedding = (
            self.string(t, "embedding_layer", pattern=_LAYER, hint="a dotted module path")
            if "embedding_layer" in t or base is None
            else base.embedding_layer
        )
        if source.kind == "torchscript" and (layers or embedding):
            field = "layers" if layers else "embedding_layer"
            self.fail(
                field,
                "TorchScript models cannot run layer or neuron methods (they need "
                "forward hooks, which TorchScript does not allow); leave it empty, or serve "
                "the eager model through a python: or export: source",
            )
        return ModelSpec(
            **self.common(model_id, t, base),
            dtype=dtype,
            inputs=inputs,
            output=OutputSpec(shape=shape, labels=labels),
            layers=layers,
            embedding_layer=embedding,
            weights=self.weights(t, source),
            explain=self.explain(t),
            **self.runtime(t, source),
        )

    def common(self, model_id: str, t: dict[str, Any], base: ModelSpec | None) -> dict[str, Any]:
        """The keys every kind of model reads alike."""
        return {
            "id": model_id,
            "version": self.version(t),
            "description": self.string(t, "description") or (base.description if base else ""),
            "source": t["source"],
            "device": self.string(t, "device", pattern=DEVICE, hint="'auto', 'cpu' or 'cuda:N'")
            or "auto",
            "internal_batch_size": self.batch(t, "internal_batch_size"),
            "perturbations_per_eval": self.batch(t, "perturbations_per_eval"),
            "base_dir": self.base_dir,
        }

    def runtime(self, t: dict[str, Any], source: Source) -> dict[str, Any]:
        """``compile``, ``compile_mode`` and ``verify_device``."""
        compiled = self.flag(t, "compile", False)
        if "compile_mode" in t and not compiled:
            self.fail("compile_mode", "takes effect with compile = true; add it, or remove this")
        if compiled and source.kind == "torchscript":
            self.fail("compile", "torch.compile does not take TorchScript modules")
        verify = t.get("verify_device")
        if verify is not None and not isinstance(verify, bool):
            self.fail("verify_device", f"expected true or false, got {_kind(verify)}")
        return {
            "compile": compiled,
            "compile_mode": self.choice(t, "compile_mode", COMPILE_MODES, "default"),
            "verify_device": verify,
        }

    def flag(self, t: dict[str, Any], key: str, default: bool) -> bool:
        v = t.get(key, default)
        if not isinstance(v, bool):
            self.fail(key, f"expected true or false, got {_kind(v)}")
        return v

    def attribution_export(self, t: dict[str, Any], model_id: str, source: Source) -> ModelSpec:
        """A program saved by ``methods.export.save``: its description supplies the method,
        the baked params and target, and the inputs; models.toml may add labels and a device."""
        for key, why in NOT_FOR_PROGRAM.items():
            if key in t:
                self.fail(key, f"not for attribution-export: sources: {why}")
        from methods.errors import InvalidArgumentError
        from methods.export import read_description

        try:
            desc = read_description(source.path(self.base_dir))
        except InvalidArgumentError as e:
            self.fail("source", str(e))
        method = self.string(t, "method")
        if desc is None and method is None:
            self.fail(
                "method",
                "the file has no attrserve.json description (it was saved with "
                "torch.export.save, not methods.export.save): name the method it computes "
                '(method = "saliency"), and declare inputs and labels or output_shape',
            )
        if desc is not None and method is not None and method != desc["method"]:
            self.fail("method", f"the file computes {desc['method']!r}, not {method!r}")
        declared = self.inputs(t) if "inputs" in t or desc is None else None
        described = self.described_inputs(desc) if desc is not None else None
        if declared is not None and described is not None:
            mismatch = [
                (j, d, f)
                for j, (d, f) in enumerate(zip(declared, described, strict=False))
                if d.dtype != f.dtype or d.shape != f.shape
            ]
            if len(declared) != len(described) or mismatch:
                self.fail(
                    "inputs",
                    "the file's program takes "
                    + ", ".join(f"{f.dtype}{_dims(f.shape)}" for f in described)
                    + "; declared "
                    + ", ".join(f"{d.dtype}{_dims(d.shape)}" for d in declared),
                )
        inputs = declared if declared is not None else described
        if inputs is None:  # one of the two is set whenever desc is None or not
            self.fail("inputs", "required")
        floats = [i.dtype for i in inputs if i.dtype in MODEL_DTYPES]
        fixed = floats[0] if floats else None
        dtype = self.choice(t, "dtype", MODEL_DTYPES, fixed or "float32")
        if fixed is not None and dtype != fixed:
            self.fail("dtype", f"the program computes in {fixed}; its dtypes are fixed")
        labels = self.labels(t)
        out_shape = (desc or {}).get("output_shape")
        if "output_shape" in t:
            shape = self.dims(t["output_shape"], "output_shape", batch=False)
        elif labels:
            shape = (len(labels),)
        elif isinstance(out_shape, list):
            shape = tuple(out_shape)
        else:
            self.fail("output_shape", "required when there are no labels")
        if labels and shape != (len(labels),):
            self.fail("labels", f"{len(labels)} labels for a model output {list(shape)}")
        if isinstance(out_shape, list) and shape != tuple(out_shape):
            field = "labels" if labels and "output_shape" not in t else "output_shape"
            self.fail(field, f"the file's model gives {out_shape} per example, not {list(shape)}")
        step = self.exported_step(desc, method)
        if step.per_example_target and shape != ((desc or {}).get("n_classes"),):
            self.fail(
                "labels" if labels else "output_shape",
                f"the program takes one class per example out of {desc and desc['n_classes']}",
            )
        return ModelSpec(
            id=model_id,
            version=self.version(t),
            description=self.string(t, "description") or f"{step.method} (attribution-export)",
            source=t["source"],
            device=self.string(t, "device", pattern=DEVICE, hint="'auto', 'cpu' or 'cuda:N'")
            or "auto",
            dtype=dtype,
            inputs=inputs,
            output=OutputSpec(shape=shape, labels=labels),
            base_dir=self.base_dir,
            exported=step,
        )

    def described_inputs(self, desc: dict[str, Any]) -> tuple[InputSpec, ...]:
        raw = desc.get("inputs")
        if not isinstance(raw, list) or not raw:
            self.fail("source", "the file's description has no inputs; declare inputs")
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
            self.fail("source", "the file's description has no valid inputs; declare inputs")

    def exported_step(self, desc: dict[str, Any] | None, method: str | None) -> ExportedStep:
        if desc is None:
            if method is None:  # attribution_export already reported it; narrows the type
                self.fail("method", "is required")
            return ExportedStep(method=method, described=False)
        target = desc.get("target")
        params = desc.get("params")
        return ExportedStep(
            method=str(desc["method"]),
            params=params if isinstance(params, dict) else None,
            target=tuple(target) if isinstance(target, list) else target,
            baselines=desc.get("baselines"),
        )

    def kind(self, t: dict[str, Any], source: Source, base: ModelSpec | None) -> str:
        default = "causal_lm" if source.kind == "hf" else (base.kind if base else "tensor")
        kind = self.choice(t, "kind", MODEL_KINDS, default)
        if source.kind == "hf" and kind != "causal_lm":
            self.fail("kind", 'hf: sources are causal language models: kind = "causal_lm"')
        if base is not None and kind != base.kind:
            self.fail("kind", f"builtin:{source.target} is of kind {base.kind!r}")
        if kind == "causal_lm" and source.kind in FILE_KINDS:
            self.fail(
                "source",
                "a causal_lm model comes from hf:DIRECTORY, builtin:tiny-lm or a python: "
                "factory returning (model, tokenizer)",
            )
        return kind

    def causal_lm(
        self, t: dict[str, Any], model_id: str, source: Source, base: ModelSpec | None
    ) -> ModelSpec:
        """A generative language model: no inputs, labels or output to declare."""
        for key in NOT_FOR_LM:
            if key in t:
                self.fail(
                    key,
                    "a causal_lm model takes prompts and attributes answers; it has no "
                    f"{key} to declare",
                )
        if source.kind == "hf" and "weights" in t:
            self.fail("weights", "hf: directories carry their own weights; remove 'weights'")
        return ModelSpec(
            **self.common(model_id, t, base),
            dtype=self.choice(t, "dtype", MODEL_DTYPES, base.dtype if base else "float32"),
            inputs=(InputSpec("ids", "int64", (None, None)),),
            output=base.output if base else OutputSpec(shape=(None, None)),
            layers=self.layers(t) if "layers" in t or base is None else base.layers,
            embedding_layer=(
                self.string(t, "embedding_layer", pattern=_LAYER, hint="a dotted module path")
                if "embedding_layer" in t or base is None
                else base.embedding_layer
            ),
            weights=None if source.kind == "hf" else self.weights(t, source),
            kind="causal_lm",
        )

    def explain(self, t: dict[str, Any]) -> ExplainSpec | None:
        """``explain = {method = "...", params = {...}}`` (the method is checked at start-up)."""
        if "explain" not in t:
            return None
        v = t["explain"]
        if not isinstance(v, dict):
            self.fail(
                "explain", f"expected a table {{method = ..., params = {{...}}}}, got {_kind(v)}"
            )
        unknown = sorted(set(v) - {"method", "params"})
        if unknown:
            self.fail(f"explain.{unknown[0]}", "unknown key; expected method and params")
        method, params = v.get("method"), v.get("params", {})
        if not isinstance(method, str) or not method:
            self.fail("explain.method", f"expected a method name, got {_kind(method)}")
        if not isinstance(params, dict):
            self.fail(
                "explain.params", f"expected a table of the method's params, got {_kind(params)}"
            )
        return ExplainSpec(method=method, params=params)

    # -- scalar fields ---------------------------------------------------------------------

    def string(
        self,
        t: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> str | None:
        if key not in t:
            if required:
                self.fail(key, "required key is missing")
            return None
        v = t[key]
        if not isinstance(v, str) or (pattern is not None and not pattern.match(v)):
            want = f"a string ({hint})" if hint else "a string"
            self.fail(key, f"expected {want}, got {_kind(v)}")
        return v

    def choice(self, t: dict[str, Any], key: str, options: tuple[str, ...], default: str) -> str:
        v = t.get(key, default)
        if v not in options:
            self.fail(key, f"expected one of {list(options)}, got {_kind(v)}")
        return str(v)

    def version(self, t: dict[str, Any]) -> str:
        v = t.get("version", "1")
        if isinstance(v, bool) or not isinstance(v, (str, int)) or v == "":
            self.fail("version", f"expected a non-empty string (or an integer), got {_kind(v)}")
        return str(v)

    def batch(self, t: dict[str, Any], key: str) -> int | str | None:
        v = t.get(key)
        if v is None or v == "auto" or (type(v) is int and v > 0):
            return v
        self.fail(key, f'expected a positive integer or "auto", got {_kind(v)}')

    # -- source and files ------------------------------------------------------------------

    def source(self, t: dict[str, Any]) -> Source:
        text = self.string(t, "source", required=True)
        if text is None:  # required=True already reported it; this narrows the type
            self.fail("source", "is required")
        try:
            source = parse_source(text)
        except ValueError as e:
            self.fail("source", str(e))
        if source.kind == "builtin" and source.target not in builtin.BUILTINS:
            self.fail(
                "source",
                f"no built-in model {source.target!r}; built-ins are "
                f"{[f'builtin:{n}' for n in builtin.BUILTINS]}",
            )
        if source.kind in FILE_KINDS:
            self.existing(source.target, "source")
        if source.kind == "hf" and not resolve_path(source.target, self.base_dir).is_dir():
            rel = "" if Path(source.target).is_absolute() else f" (relative to {self.base_dir})"
            self.fail(
                "source",
                f"directory {source.target!r} not found{rel}; hf: takes a local Hugging Face "
                "model directory (config, weights, tokenizer files)",
            )
        return source

    def weights(self, t: dict[str, Any], source: Source) -> str | None:
        w = self.string(t, "weights")
        if w is None:
            return None
        if source.kind in FILE_KINDS:
            self.fail("weights", f"{source.kind}: files carry their own weights; remove 'weights'")
        self.existing(w, "weights")
        return w

    def existing(self, path: str, field: str) -> None:
        p = resolve_path(path, self.base_dir)
        if not p.is_file():
            rel = "" if Path(path).is_absolute() else f" (relative to {self.base_dir})"
            self.fail(field, f"file {path!r} not found{rel}")

    # -- arrays ----------------------------------------------------------------------------

    def dims(self, v: object, field: str, *, batch: bool) -> tuple[int | None, ...]:
        want = 'an array of dims: positive integers, or strings naming free dims ("N")' + (
            ", with dim 0 free (the batch)" if batch else ""
        )
        if not isinstance(v, list) or (batch and not v):
            self.fail(field, f"expected {want}, got {_kind(v)}")
        dims: list[int | None] = []
        for j, d in enumerate(v):
            if isinstance(d, str) and d:
                dims.append(None)
            elif type(d) is int and d > 0 and not (batch and j == 0):
                dims.append(d)
            elif batch and j == 0:
                self.fail(field, f'dim 0 is the batch and must be free (write "N"), got {d!r}')
            else:
                self.fail(field, f"expected {want}; dim {j} is {_kind(d)}")
        return tuple(dims)

    def inputs(self, t: dict[str, Any]) -> tuple[InputSpec, ...]:
        v = t.get("inputs")
        if not isinstance(v, list) or not v:
            self.fail(
                "inputs",
                "expected a non-empty array of {name, dtype, shape} tables, got " + _kind(v),
            )
        out: list[InputSpec] = []
        for j, it in enumerate(v):
            at = f"inputs[{j}]"
            if not isinstance(it, dict):
                self.fail(at, f"expected a table {{name, dtype, shape}}, got {_kind(it)}")
            unknown = sorted(set(it) - set(INPUT_KEYS))
            missing = [k for k in INPUT_KEYS if k not in it]
            if unknown or missing:
                bad = unknown[0] if unknown else missing[0]
                what = f"unknown key(s) {unknown}" if unknown else f"missing key(s) {missing}"
                self.fail(f"{at}.{bad}", f"{what}; an input has exactly {list(INPUT_KEYS)}")
            name = it["name"]
            if not isinstance(name, str) or not _NAME.match(name):
                self.fail(f"{at}.name", f"expected an identifier string, got {_kind(name)}")
            if any(i.name == name for i in out):
                self.fail(f"{at}.name", f"duplicate input name {name!r}")
            if it["dtype"] not in INPUT_DTYPES:
                got = _kind(it["dtype"])
                self.fail(f"{at}.dtype", f"expected one of {list(INPUT_DTYPES)}, got {got}")
            out.append(
                InputSpec(name, it["dtype"], self.dims(it["shape"], f"{at}.shape", batch=True))
            )
        return tuple(out)

    def names(
        self, t: dict[str, Any], key: str, check: Callable[[str], bool], hint: str
    ) -> tuple[str, ...]:
        v = t.get(key, [])
        if not isinstance(v, list):
            self.fail(key, f"expected an array of strings ({hint}), got {_kind(v)}")
        for j, s in enumerate(v):
            if not isinstance(s, str) or not check(s):
                self.fail(f"{key}[{j}]", f"expected a string ({hint}), got {_kind(s)}")
            if s in v[:j]:
                self.fail(f"{key}[{j}]", f"duplicate entry {s!r}")
        return tuple(v)

    def labels(self, t: dict[str, Any]) -> tuple[str, ...]:
        return self.names(t, "labels", lambda s: bool(s.strip()), "non-empty class names")

    def layers(self, t: dict[str, Any]) -> tuple[str, ...]:
        return self.names(t, "layers", lambda s: bool(_LAYER.match(s)), "dotted module paths")
