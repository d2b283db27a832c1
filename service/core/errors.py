"""The service's one error hierarchy: each error carries its HTTP status and a stable code.

Errors cross the worker process boundary as plain data (``to_data`` / ``from_data``) and are
turned into the problem+json envelope in one place (``service.http.problems``).
"""

from __future__ import annotations

from typing import Any

Loc = tuple[str | int, ...]


class ServiceError(Exception):
    """Base of every error the service answers with on purpose."""

    status = 500
    code = "internal"
    title = "Internal error"

    def __init__(
        self,
        detail: str,
        *,
        loc: Loc | None = None,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.errors = (
            errors if errors is not None else ([{"loc": list(loc), "msg": detail}] if loc else [])
        )
        self.headers = headers or {}

    def to_data(self) -> dict[str, Any]:
        return {"code": self.code, "detail": self.detail, "errors": self.errors}

    @staticmethod
    def from_data(data: dict[str, Any]) -> ServiceError:
        cls = _BY_CODE.get(data.get("code", ""), ServiceError)
        return cls(data.get("detail", ""), errors=data.get("errors") or [])


class MalformedRequest(ServiceError):
    status, code, title = 400, "malformed_request", "Malformed request"


class Unauthorized(ServiceError):
    status, code, title = 401, "unauthorized", "Missing or invalid API key"


class Forbidden(ServiceError):
    status, code, title = 403, "forbidden", "API key not allowed for this model"


class UnknownModel(ServiceError):
    status, code, title = 404, "unknown_model", "Unknown model"


class UnknownMethod(ServiceError):
    status, code, title = 404, "unknown_method", "Unknown method"


class NotFound(ServiceError):
    status, code, title = 404, "not_found", "Not found"


class Conflict(ServiceError):
    status, code, title = 409, "conflict", "Not in a state for this"


class BodyTooLarge(ServiceError):
    status, code, title = 413, "body_too_large", "Request body too large"


class InvalidRequest(ServiceError):
    """Valid JSON that cannot be served: shape, dtype, NaN, target, limits, ..."""

    status, code, title = 422, "invalid_request", "Request cannot be served"


class LimitExceeded(InvalidRequest):
    code, title = "limit_exceeded", "Request over a server limit"


class UnsupportedMethod(InvalidRequest):
    code, title = "unsupported_method", "Method not supported by this model"


class AttributionFailed(InvalidRequest):
    """The engine rejected the request (an ``AttributionError``)."""

    code, title = "attribution_error", "Attribution failed"


class StorageFull(ServiceError):
    status, code, title = 507, "storage_full", "Insufficient storage"


class QueueFull(ServiceError):
    status, code, title = 429, "queue_full", "Too many requests queued"


class RequestCancelled(ServiceError):
    """The client went away (nginx's 499); nobody reads the answer, but logs and metrics do."""

    status, code, title = 499, "cancelled", "Client closed the request"


class NotReady(ServiceError):
    status, code, title = 503, "not_ready", "Service not ready"


class WorkerLost(ServiceError):
    status, code, title = 503, "worker_lost", "Worker lost while serving the request"


class DeadlineExceeded(ServiceError):
    status, code, title = 504, "deadline_exceeded", "Deadline passed"


def _subclasses(cls: type[ServiceError]) -> list[type[ServiceError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


_BY_CODE: dict[str, type[ServiceError]] = {c.code: c for c in _subclasses(ServiceError)}


#: engine arguments that are top-level request fields; any other argument is a method param
_TOP_LEVEL = frozenset(
    {
        "inputs",
        "target",
        "baselines",
        "internal_batch_size",
        "perturbations_per_eval",
        "noise_tunnel",
        "seed",
        "return_convergence_delta",
        "method",
    }
)


def from_engine(exc: Exception) -> ServiceError:
    """An engine ``AttributionError`` as a service error (404 for unknown methods, else 422)."""
    from methods.errors import UnknownMethodError

    arg = getattr(exc, "argument", None)
    loc: Loc = ("body",)
    if arg:
        parts: list[str | int] = [int(p) if p.isdigit() else p for p in str(arg).split(".")]
        loc = ("body", *parts) if parts[0] in _TOP_LEVEL else ("body", "params", *parts)
    if isinstance(exc, UnknownMethodError):
        from methods.registry import did_you_mean

        name, close = getattr(exc, "requested", "?"), getattr(exc, "suggestions", [])
        return UnknownMethod(
            f"unknown method {name!r}{did_you_mean(close)}; GET /v1/methods lists every "
            "method and its parameters",
            loc=loc,
        )
    return AttributionFailed(str(exc), loc=loc)
