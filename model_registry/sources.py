"""The ``source`` string of a model: which loader, and what it loads.

Shared by the models.toml parser (to reject a bad source with the file and field named) and
the loaders (to dispatch), so both agree on the syntax.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

KINDS = ("builtin", "torchscript", "export", "attribution-export", "python", "hf")
#: sources that are one file (checked to exist when models.toml is read)
FILE_KINDS = ("torchscript", "export", "attribution-export")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_PYTHON = re.compile(rf"^(?P<module>{_DOTTED}):(?P<attr>{_DOTTED})$")

#: dtypes a model's parameters may be cast to (the "working" dtype of gradient methods)
MODEL_DTYPES = ("float16", "bfloat16", "float32", "float64")
#: dtypes a model input may have
INPUT_DTYPES = (*MODEL_DTYPES, "int8", "int16", "int32", "int64", "uint8", "bool")
DEVICE = re.compile(r"^(auto|cpu|cuda:\d+)$")


@dataclass(frozen=True)
class Source:
    kind: str  # one of KINDS
    target: str  # builtin name, file path, or "package.module:factory"

    @property
    def module(self) -> str:
        """python sources: the module to import."""
        return self.target.partition(":")[0]

    @property
    def attr(self) -> str:
        """python sources: the (dotted) factory attribute inside the module."""
        return self.target.partition(":")[2]

    def path(self, base_dir: str | None) -> Path:
        """File sources: the file (hf: the directory), relative paths taken from ``base_dir``."""
        return resolve_path(self.target, base_dir)


def resolve_path(path: str, base_dir: str | None) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() or base_dir is None else Path(base_dir) / p


def parse_source(text: str) -> Source:
    """Split ``text`` into kind and target; ValueError (saying what was expected) if malformed."""
    kind, sep, target = text.partition(":")
    if not sep or kind not in KINDS:
        raise ValueError(
            "expected 'builtin:NAME', 'torchscript:PATH', 'export:PATH', "
            "'attribution-export:PATH', 'python:package.module:factory' or 'hf:DIRECTORY', "
            f"got {text!r}"
        )
    if not target:
        raise ValueError(f"{kind}: source needs a target after the colon, got {text!r}")
    if kind == "python" and not _PYTHON.match(target):
        raise ValueError(
            f"expected 'python:package.module:factory' (dotted module, colon, factory name), "
            f"got {text!r}"
        )
    return Source(kind, target)
