"""The engine's one error hierarchy.

Every error names the argument at fault (``argument``) and says what was expected, so the
service can turn it into a field-level problem report without parsing messages.
"""

from __future__ import annotations

import math


class AttributionError(Exception):
    """Base of every error the engine raises on purpose."""

    def __init__(self, message: str, *, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument


class InvalidArgumentError(AttributionError, ValueError):
    """An argument has the right type but a value the method cannot use."""


class InvalidTypeError(AttributionError, TypeError):
    """An argument (or the model's output) has a type the method cannot use."""


class UnknownMethodError(InvalidArgumentError):
    """No method is registered under the requested name."""

    #: the name asked for, and the registered names closest to it
    requested: str = ""
    suggestions: list[str] = []  # noqa: RUF012 - set per instance by the registry


class UnknownParameterError(InvalidArgumentError):
    """A keyword parameter the method does not take."""


class TargetError(InvalidArgumentError):
    """``target`` does not select one scalar per example of the model output."""


class BaselineError(InvalidArgumentError):
    """``baselines`` cannot be matched against ``inputs``."""


class UnsupportedLayerError(InvalidArgumentError):
    """The layer's value has a structure the method cannot attribute (its message names the
    layer and the structure, e.g. a packed sequence or a tensor without the batch)."""


class UnsupportedModelError(AttributionError, TypeError):
    """The method cannot run on this kind of model (e.g. hooks on TorchScript)."""


class ModelError(AttributionError, RuntimeError):
    """The model itself raised while being evaluated."""


class AttributionCancelled(AttributionError):
    """The attribution was cancelled (see ``methods.cancel_scope``)."""

    def __init__(
        self, message: str = "the attribution was cancelled", *, argument: str | None = None
    ) -> None:
        super().__init__(message, argument=argument)


def positive_number(value: object, argument: str, what: str | None = None) -> float:
    """``value`` as a float if it is a finite number above 0 (not a bool); otherwise an
    ``InvalidArgumentError`` naming ``argument`` (``what``: how the message names it)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgumentError(
            f"{what or argument} must be a positive number, got {value!r}", argument=argument
        )
    return float(value)
