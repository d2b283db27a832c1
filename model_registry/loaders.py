"""Turn a ModelSpec into a LoadedModel: the spec's source builds or reads the model, its kind
puts it on its device and checks it.

Nothing here reaches the network: built-in weights are committed files, other sources are local
paths (relative ones taken from the models.toml's directory), and python factories are imported
from the environment or from that directory.
"""

from __future__ import annotations

from model_registry.checks import check_dtype, check_forward, check_layers, resolve_device
from model_registry.errors import RegistryError
from model_registry.sources import SOURCES, parse_source
from model_registry.spec import LoadedModel, ModelSpec

__all__ = ["check_forward", "check_layers", "load", "resolve_device"]


def load(spec: ModelSpec) -> LoadedModel:
    """Load ``spec``'s model on its device in its dtype, in eval mode, with its layers checked.

    Raises RegistryError naming the model and the field at fault.
    """
    try:
        source = parse_source(spec.source)
    except ValueError as e:
        raise RegistryError(str(e), model=spec.id, field="source") from None
    device = resolve_device(spec.device, spec.id)
    check_dtype(spec)
    return SOURCES[source.name].load(spec, source, device)
