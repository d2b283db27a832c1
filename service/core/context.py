"""The current request's id (set by ``service.http.middleware.RequestContext``) and the loggers that
carry it."""

from __future__ import annotations

import contextvars
import logging

#: the current request's X-Request-ID, for problem bodies and log lines
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")

access_log = logging.getLogger("attrserve.access")
error_log = logging.getLogger("attrserve.error")
