"""The engine's errors as the service's: the one mapping from ``methods.errors`` to a problem.

An ``AttributionError`` names the engine argument at fault (``argument``); it is located where
the request body has it: a request field (``body.target``), else a method param
(``body.params.<name>``), unless a kind of model says otherwise (``where``).
"""

from __future__ import annotations

from collections.abc import Mapping

from methods.errors import AttributionError, ModelError, UnknownMethodError
from methods.registry import did_you_mean
from service.core.errors import AttributionFailed, Loc, ServiceError, UnknownMethod
from service.wire.attributions import REQUEST_FIELDS


def locate(argument: str | None, where: Mapping[str, Loc] | None = None) -> Loc:
    """The body location of an engine argument (dotted paths: ``baselines.0``)."""
    if not argument:
        return ("body",)
    if where is not None and argument in where:
        return where[argument]
    parts: list[str | int] = [int(p) if p.isdigit() else p for p in str(argument).split(".")]
    top = parts[0] in REQUEST_FIELDS or parts[0] == "method"
    return ("body", *parts) if top else ("body", "params", *parts)


def from_engine(
    exc: Exception, request_id: str = "", where: Mapping[str, Loc] | None = None
) -> ServiceError:
    """``exc`` (an ``AttributionError``) as the service's error: 404 for unknown methods, a
    422 located at the argument at fault otherwise. A model's own failure (``ModelError``)
    keeps its text out of the answer (it may hold internals): the log has it, under
    ``request_id``."""
    loc = locate(getattr(exc, "argument", None), where)
    if isinstance(exc, UnknownMethodError):
        return UnknownMethod(
            f"unknown method {exc.requested!r}{did_you_mean(exc.suggestions)}; GET /v1/methods "
            "lists every method and its parameters",
            loc=loc,
        )
    if isinstance(exc, ModelError):
        cause = type(exc.__cause__).__name__ if exc.__cause__ is not None else "an error"
        return AttributionFailed(
            f"the model raised {cause} on these inputs; the server log has the details under "
            f"request id {request_id}",
            loc=("body", "inputs"),
        )
    if isinstance(exc, AttributionError):
        return AttributionFailed(str(exc), loc=loc)
    return ServiceError(f"internal error (request id {request_id or 'unknown'})")
