"""One ``[[models]]`` table of a models.toml, read key by key.

Every reader checks one key's type and form and says what was expected; every error names the
file, the model (once its id is known), its index in the array, and the field. The sources and
the model kinds read the keys that concern them through a ``Table``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from model_registry.errors import RegistryError
from model_registry.spec import DEVICE, INPUT_DTYPES, InputSpec, ModelSpec, resolve_path

INPUT_KEYS = ("name", "dtype", "shape")
#: an input table's optional keys
INPUT_OPTIONAL = ("features",)
ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")  # safe in a URL path segment
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LAYER = re.compile(r"^[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*$")


def describe_value(v: object) -> str:
    """A TOML value as an error message names it: "a string 'x'", "an array", ..."""
    if v is None:
        return "nothing"
    kinds = {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}
    kinds |= {int: "an integer", float: "a float"}
    name = kinds.get(type(v), type(v).__name__)
    return name if isinstance(v, (dict, list)) else f"{name} {v!r}"


def dims_text(shape: tuple[int | None, ...]) -> str:
    """``(None, 8)`` as ``[N, 8]``."""
    return "[" + ", ".join("N" if d is None else str(d) for d in shape) + "]"


class Table:
    """One [[models]] table; remembers where it is, for the error messages."""

    def __init__(
        self, data: Mapping[str, Any], file: str, index: int, base_dir: str | None
    ) -> None:
        self.data, self.file, self.index, self.base_dir = data, file, index, base_dir
        self.id: str | None = None

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def fail(self, field: str | None, message: str) -> NoReturn:
        raise RegistryError(
            message, file=self.file, model=self.id, index=self.index, field=field
        ) from None

    def refuse(self, keys: Mapping[str, str]) -> None:
        """Fail on the first key of ``keys`` the table gives, with its message."""
        for key, why in keys.items():
            if key in self.data:
                self.fail(key, why)

    def common(self, *, description: str = "") -> dict[str, Any]:
        """The ModelSpec fields every kind of model reads alike (``description``: the default)."""
        model_id = self.string("id", required=True, pattern=ID, hint="letters, digits, . _ -")
        source = self.string("source", required=True)
        return {
            "id": model_id,
            "version": self.version(),
            "description": self.string("description") or description,
            "source": source,
            "device": self.string("device", pattern=DEVICE, hint="'auto', 'cpu' or 'cuda:N'")
            or "auto",
            "internal_batch_size": self.batch("internal_batch_size"),
            "perturbations_per_eval": self.batch("perturbations_per_eval"),
            "base_dir": self.base_dir,
            "group": self.string("group", pattern=ID, hint="letters, digits, . _ -"),
            "workers": self.count("workers"),
            "defaults": self.defaults(),
        }

    def defaults(self) -> dict[str, dict[str, Any]]:
        """``defaults = {<method> = {<param> = <value>, ...}, ...}``: the params a request of
        that method leaves out (each checked against its method when the server starts)."""
        v = self.data.get("defaults", {})
        if not isinstance(v, dict):
            self.fail(
                "defaults",
                "expected a table of methods, each a table of its params (e.g. defaults = "
                f'{{integrated_gradients = {{n_steps = "auto"}}}}), got {describe_value(v)}',
            )
        for method, params in v.items():
            if not isinstance(params, dict):
                self.fail(
                    f"defaults.{method}",
                    f"expected a table of {method}'s params, got {describe_value(params)}",
                )
        return {str(m): dict(p) for m, p in v.items()}

    # -- scalar fields ---------------------------------------------------------------------

    def string(
        self,
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> str | None:
        if key not in self.data:
            if required:
                self.fail(key, "required key is missing")
            return None
        v = self.data[key]
        if not isinstance(v, str) or (pattern is not None and not pattern.match(v)):
            want = f"a string ({hint})" if hint else "a string"
            self.fail(key, f"expected {want}, got {describe_value(v)}")
        return v

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        v = self.data.get(key, default)
        if v not in options:
            self.fail(key, f"expected one of {list(options)}, got {describe_value(v)}")
        return str(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            self.fail(key, f"expected true or false, got {describe_value(v)}")
        return v

    def version(self) -> str:
        v = self.data.get("version", "1")
        if isinstance(v, bool) or not isinstance(v, (str, int)) or v == "":
            self.fail(
                "version", f"expected a non-empty string (or an integer), got {describe_value(v)}"
            )
        return str(v)

    def count(self, key: str) -> int | None:
        v = self.data.get(key)
        if v is None or (type(v) is int and v > 0):
            return v
        self.fail(key, f"expected a positive integer, got {describe_value(v)}")

    def batch(self, key: str) -> int | str | None:
        v = self.data.get(key)
        if v is None or v == "auto" or (type(v) is int and v > 0):
            return v
        self.fail(key, f'expected a positive integer or "auto", got {describe_value(v)}')

    def embedding_layer(self, base: ModelSpec | None) -> str | None:
        """``embedding_layer``; a built-in's own when not given."""
        if base is not None and "embedding_layer" not in self.data:
            return base.embedding_layer
        return self.string("embedding_layer", pattern=LAYER, hint="a dotted module path")

    # -- files -----------------------------------------------------------------------------

    def inside(self, path: str, field: str) -> None:
        """Fail on ``field`` if a relative ``path`` leaves the models.toml's directory
        (``../../etc/...``): files elsewhere are named by an absolute path, on purpose."""
        if Path(path).expanduser().is_absolute() or self.base_dir is None:
            return
        # lexically: ".." may not climb out; a symlink placed in the directory is the
        # operator's own choice and is followed
        base = Path(os.path.abspath(self.base_dir))
        if not Path(os.path.normpath(base / path)).is_relative_to(base):
            self.fail(
                field,
                f"{path!r} leaves the directory of the models.toml ({base}); give an absolute "
                "path for a file elsewhere",
            )

    def existing(self, path: str, field: str) -> None:
        """Fail on ``field`` unless ``path`` (relative: to the models.toml) is a file."""
        if not resolve_path(path, self.base_dir).is_file():
            self.fail(field, f"file {path!r} not found{self.relative(path)}")

    def relative(self, path: str) -> str:
        """The note " (relative to DIR)" for a relative ``path``, for error messages."""
        return "" if Path(path).is_absolute() else f" (relative to {self.base_dir})"

    def weights(self) -> str | None:
        """``weights``: an existing file (the sources that take none refuse the key)."""
        w = self.string("weights")
        if w is not None:
            self.inside(w, "weights")
            self.existing(w, "weights")
        return w

    # -- arrays ----------------------------------------------------------------------------

    def dims(self, v: object, field: str, *, batch: bool) -> tuple[int | None, ...]:
        want = 'an array of dims: positive integers, or strings naming free dims ("N")' + (
            ", with dim 0 free (the batch)" if batch else ""
        )
        if not isinstance(v, list) or (batch and not v):
            self.fail(field, f"expected {want}, got {describe_value(v)}")
        dims: list[int | None] = []
        for j, d in enumerate(v):
            if isinstance(d, str) and d:
                dims.append(None)
            elif type(d) is int and d > 0 and not (batch and j == 0):
                dims.append(d)
            elif batch and j == 0:
                self.fail(field, f'dim 0 is the batch and must be free (write "N"), got {d!r}')
            else:
                self.fail(field, f"expected {want}; dim {j} is {describe_value(d)}")
        return tuple(dims)

    def output_shape(self) -> tuple[int | None, ...]:
        """``output_shape`` as given (per example, no batch dim)."""
        return self.dims(self.data.get("output_shape"), "output_shape", batch=False)

    def inputs(self) -> tuple[InputSpec, ...]:
        v = self.data.get("inputs")
        if not isinstance(v, list) or not v:
            self.fail(
                "inputs",
                "expected a non-empty array of {name, dtype, shape} tables, got "
                + describe_value(v),
            )
        out: list[InputSpec] = []
        for j, it in enumerate(v):
            at = f"inputs[{j}]"
            if not isinstance(it, dict):
                self.fail(at, f"expected a table {{name, dtype, shape}}, got {describe_value(it)}")
            unknown = sorted(set(it) - set(INPUT_KEYS) - set(INPUT_OPTIONAL))
            missing = [k for k in INPUT_KEYS if k not in it]
            if unknown or missing:
                bad = unknown[0] if unknown else missing[0]
                what = f"unknown key(s) {unknown}" if unknown else f"missing key(s) {missing}"
                self.fail(
                    f"{at}.{bad}",
                    f"{what}; an input has {list(INPUT_KEYS)}, optionally {list(INPUT_OPTIONAL)}",
                )
            name = it["name"]
            if not isinstance(name, str) or not _NAME.match(name):
                self.fail(
                    f"{at}.name", f"expected an identifier string, got {describe_value(name)}"
                )
            if any(i.name == name for i in out):
                self.fail(f"{at}.name", f"duplicate input name {name!r}")
            if it["dtype"] not in INPUT_DTYPES:
                got = describe_value(it["dtype"])
                self.fail(f"{at}.dtype", f"expected one of {list(INPUT_DTYPES)}, got {got}")
            shape = self.dims(it["shape"], f"{at}.shape", batch=True)
            out.append(InputSpec(name, it["dtype"], shape, self.features(it, shape, at)))
        return tuple(out)

    def features(
        self, it: Mapping[str, Any], shape: tuple[int | None, ...], at: str
    ) -> tuple[str, ...] | None:
        """An input's optional ``features``: one unique name per feature of an [N, F] row."""
        v = it.get("features")
        if v is None:
            return None
        if len(shape) != 2 or shape[1] is None:
            self.fail(f"{at}.features", "features names the columns of an [N, F] input")
        if not isinstance(v, list) or not all(isinstance(f, str) and f for f in v):
            self.fail(f"{at}.features", f"expected an array of names, got {describe_value(v)}")
        if len(v) != shape[1] or len(set(v)) != len(v):
            self.fail(f"{at}.features", f"expected {shape[1]} distinct names, got {len(v)}")
        return tuple(v)

    def names(self, key: str, check: Callable[[str], bool], hint: str) -> tuple[str, ...]:
        v = self.data.get(key, [])
        if not isinstance(v, list):
            self.fail(key, f"expected an array of strings ({hint}), got {describe_value(v)}")
        for j, s in enumerate(v):
            if not isinstance(s, str) or not check(s):
                self.fail(f"{key}[{j}]", f"expected a string ({hint}), got {describe_value(s)}")
            if s in v[:j]:
                self.fail(f"{key}[{j}]", f"duplicate entry {s!r}")
        return tuple(v)

    def labels(self) -> tuple[str, ...]:
        return self.names("labels", lambda s: bool(s.strip()), "non-empty class names")

    def layers(self, base: ModelSpec | None = None) -> tuple[str, ...]:
        """``layers``; a built-in's own when not given."""
        if base is not None and "layers" not in self.data:
            return base.layers
        return self.names("layers", lambda s: bool(LAYER.match(s)), "dotted module paths")
