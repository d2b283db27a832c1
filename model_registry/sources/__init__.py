"""Model sources, one module each, registered by name in ``SOURCES`` (``base.register``).

A ``source = "NAME:TARGET"`` string names its source by the prefix; the models.toml parser
(to check the target and build the spec) and the loader (to build the model) look it up here
once. A new source is one module with a registered ``ModelSource`` subclass, imported below.
"""

from model_registry.sources import (
    attribution_export,
    builtin,
    export,
    hf,
    python,
    remote,
    torchscript,
)
from model_registry.sources.base import (
    SOURCES,
    FileSource,
    ModelSource,
    Source,
    parse_source,
    preload,
    register,
    source_of,
)
from model_registry.spec import DEVICE, INPUT_DTYPES, MODEL_DTYPES, resolve_path

#: every source's name, in the order errors list them
NAMES = tuple(SOURCES)

__all__ = [
    "DEVICE",
    "INPUT_DTYPES",
    "MODEL_DTYPES",
    "NAMES",
    "SOURCES",
    "FileSource",
    "ModelSource",
    "Source",
    "attribution_export",
    "builtin",
    "export",
    "hf",
    "parse_source",
    "preload",
    "python",
    "register",
    "remote",
    "resolve_path",
    "source_of",
    "torchscript",
]
