"""The service's one error hierarchy: each error carries its HTTP status and a stable code.

Errors cross the worker process boundary as plain data (``to_data`` / ``from_data``) and are
turned into the problem+json envelope in one place (``service.http.problems``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Loc = tuple[str | int, ...]
#: where a detail names its field: ``"{where} has shape [1, 2]"``
WHERE = "{where}"


def where(loc: Loc | list[Any]) -> str:
    """A body location as a message names it: ``inputs.0`` (``body`` for the body itself)."""
    return ".".join(str(p) for p in loc[1:]) or "body"


class ServiceError(Exception):
    """Base of every error the service answers with on purpose.

    A detail that begins with the field it is about is written ``"{where} ..."`` with ``about``
    the field's location: it is rendered from that location, so an error re-pointed to where
    another protocol's body has the field (KServe's ``instances``, OIP's ``parameters``) names
    the new place (``relocate``), without matching message text."""

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
        about: Loc | None = None,
        members: dict[str, Any] | None = None,
    ) -> None:
        if about is None and loc is not None and detail.startswith(WHERE):
            about = loc
        self.template = detail
        self.about = about
        super().__init__(self.detail)
        self.errors = (
            errors
            if errors is not None
            else ([{"loc": list(loc), "msg": self.detail}] if loc else [])
        )
        self.headers = headers or {}
        #: members of the problem object beyond the standard ones (e.g. ``upstream_status``)
        self.members = dict(members or {})

    @property
    def detail(self) -> str:
        if self.about is None or not self.template.startswith(WHERE):
            return self.template
        return where(self.about) + self.template[len(WHERE) :]

    def relocate(self, move: Callable[[Loc], Loc]) -> ServiceError:
        """Point the error's locations (``body.*`` ones) where ``move`` says; a detail that
        names its field is rendered anew."""
        old = self.detail

        def moved(loc: Loc) -> Loc:
            return move(loc) if loc[:1] == ("body",) else loc

        if self.about is not None:
            self.about = moved(tuple(self.about))
        self.errors = [
            {
                **e,
                "loc": list(moved(tuple(e.get("loc") or ()))),
                "msg": self.detail if e.get("msg") == old else e.get("msg"),
            }
            for e in self.errors
        ]
        self.args = (self.detail,)
        return self

    def to_data(self) -> dict[str, Any]:
        about = None if self.about is None else list(self.about)
        return {
            "code": self.code,
            "detail": self.template,
            "errors": self.errors,
            "about": about,
            "members": self.members,
        }

    @staticmethod
    def from_data(data: dict[str, Any]) -> ServiceError:
        cls = _BY_CODE.get(data.get("code", ""), ServiceError)
        about = data.get("about")
        return cls(
            data.get("detail", ""),
            errors=data.get("errors") or [],
            about=None if about is None else tuple(about),
            members=data.get("members"),
        )


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


class ImageTooLarge(ServiceError):
    """An image whose header declares more pixels than the server decodes (refused unread)."""

    status, code, title = 413, "image_too_large", "Image too large"


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


class JobUnreadable(ServiceError):
    """A stored job's work cannot be read back (a file of another version, or damaged)."""

    status, code, title = 500, "job_unreadable", "Job cannot be read"


class StorageFull(ServiceError):
    status, code, title = 507, "storage_full", "Insufficient storage"


class QueueFull(ServiceError):
    status, code, title = 429, "queue_full", "Too many requests queued"


class RequestCancelled(ServiceError):
    """The client went away (nginx's 499); nobody reads the answer, but logs and metrics do."""

    status, code, title = 499, "cancelled", "Client closed the request"


class NotReady(ServiceError):
    status, code, title = 503, "not_ready", "Service not ready"


class ModelUnavailable(NotReady):
    """A model that failed (to load, its checks, or its worker crashed): answered at once."""

    code, title = "model_unavailable", "Model not available"

    @classmethod
    def of(
        cls, model_id: str, reason: str | None, headers: dict[str, str] | None = None
    ) -> ModelUnavailable:
        why = f": {reason}" if reason else ""
        return cls(
            f"model {model_id!r} is not available{why}",
            loc=("path", "model_id"),
            headers=headers,
        )


class LoadFailed(ServiceError):
    """A model repository load that did not become ready (the version before serves on)."""

    status, code, title = 400, "load_failed", "Model load failed"


class WorkerLost(ServiceError):
    status, code, title = 503, "worker_lost", "Worker lost while serving the request"


class UpstreamFailed(ServiceError):
    """A remote model's predictor answered wrongly, with an error, or not at all (its problem
    object carries ``upstream_status``: the predictor's HTTP status, null without one)."""

    status, code, title = 502, "upstream_error", "The model's predictor failed"


class UpstreamTimeout(ServiceError):
    """A remote model's predictor did not answer in time."""

    status, code, title = 504, "upstream_timeout", "The model's predictor timed out"


class DeadlineExceeded(ServiceError):
    status, code, title = 504, "deadline_exceeded", "Deadline passed"


def _subclasses(cls: type[ServiceError]) -> list[type[ServiceError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


_BY_CODE: dict[str, type[ServiceError]] = {c.code: c for c in _subclasses(ServiceError)}
