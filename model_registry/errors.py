"""The registry's one error type.

Every error names where it happened (the models.toml file, the model id or its index, the field)
so an operator can fix the configuration without reading a traceback. The parts are also kept as
attributes, for the service to report them as data.
"""

from __future__ import annotations


class RegistryError(Exception):
    """A model cannot be configured or loaded; the message says where and what was expected."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        model: str | None = None,
        index: int | None = None,
        field: str | None = None,
    ) -> None:
        self.detail = message
        self.file = file
        self.model = model  # the model id, when known
        self.index = index  # position in the file's [[models]] array, when known
        self.field = field
        where = [file] if file else []
        if model is not None:
            where.append(f"model {model!r}" + (f" (models[{index}])" if index is not None else ""))
        elif index is not None:
            where.append(f"models[{index}]")
        if field:
            where.append(f"field {field!r}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
