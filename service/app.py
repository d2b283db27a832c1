"""``create_app(settings)``: the FastAPI app, its routes, errors, body limit and worker pool."""

from __future__ import annotations

import gc
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import methods
import model_registry
from service import kinds
from service.attributions import router as attributions
from service.catalog import health
from service.catalog import router as catalog
from service.compat import kserve
from service.compat import router as compat
from service.concepts import router as concepts
from service.contexts import router as contexts
from service.core.errors import ServiceError
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.dependence import router as dependence
from service.explorer import router as explorer
from service.http import docs, openapi_doc, problems
from service.http.limits import BodyLimit
from service.http.middleware import ApiKeys, RequestContext
from service.http.responses import OrjsonResponse
from service.http.routing import RouteTable, found
from service.http.state import AppState
from service.influence import router as influence
from service.jobs import router as jobs
from service.jobs.runner import JobRunner
from service.monitor import router as monitor
from service.pool.pool import WorkerPool
from service.predictions import router as predictions
from service.repository import router as repository
from service.robustness import router as robustness
from service.serving.capability import Capability
from service.summaries import router as summaries

log = logging.getLogger("attrserve")
#: each capability folder's router module, mounted in this order (the order requests are
#: matched and the API document lists them): a new capability is its folder and one entry here
CAPABILITIES = (
    health,
    catalog,
    attributions,
    contexts,
    compat,
    jobs,
    summaries,
    predictions,
    dependence,
    monitor,
    repository,
    concepts,
    influence,
    robustness,
    explorer,
)
#: the operations (``service.serving.capability.Capability``), each served at ``POST
#: /v1/models/{id}/{operation}`` and ``{stem}-jobs``: what the folders above declare in their
#: router module's ``OPERATIONS`` (a job answers as its operation's route)
OPERATIONS: tuple[Capability[Any], ...] = tuple(
    op for folder in CAPABILITIES for op in getattr(folder, "OPERATIONS", ())
)
DESCRIPTION = (
    "Attributions for PyTorch models over HTTP: Captum's catalogue, exact and fast. "
    "Errors are application/problem+json (RFC 9457)."
)


class StartRefused(Exception):
    """The server does not start, for the reason its message gives (no traceback)."""


class AttrServe(FastAPI):
    """The FastAPI app inside our own middleware (``outer``: request id and access log, the
    route found once, body limit, API keys), which every request passes.

    A route that declares a fast handler (``service.http.routing.Policy.fast``: the attribution
    route, KServe's and OIP's model routes) is served by it in front of FastAPI's machinery,
    which gets whatever the handler does not answer itself; ``fast_path`` off: FastAPI serves
    every route (the same answers, the load benchmark's baseline).
    """

    fast_path: bool | None = True
    outer: ASGIApp | None = None
    table: RouteTable | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.outer is not None and scope["type"] == "http":
            await self.outer(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A start refused for a configuration mistake (``StartRefused``) is its one message,
        not the traceback Starlette reports for any failed start (the server exits all the
        same)."""
        held: list[Message] = []

        async def hold_failure(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                held.append(message)  # sent below, once the exception says what it was
            else:
                await send(message)

        try:
            await super().__call__(scope, receive, hold_failure)
            for message in held:  # a failure reported without an exception: as it came
                await send(message)
        except StartRefused as exc:
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            raise
        except BaseException:
            for message in held:
                await send(message)
            raise

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = found(scope)
        if not route.full and self.table is not None:
            moved = _slash_redirect(self.table, scope)
            if moved is not None:  # what Starlette redirects with an empty body, said in words
                await moved(scope, receive, send)
                return
        fast = route.policy.fast
        if fast is not None and self.fast_path and route.full and not scope.get("root_path"):
            state = self.state.attrserve
            await fast(state, self.fastapi_call, route.params, scope, receive, send)
        else:
            await super().__call__(scope, receive, send)

    async def fastapi_call(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            doc = super().openapi()
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in openapi_doc.RAW_SCHEMAS.items():  # the raw routes' request bodies
                schemas.setdefault(name, schema)
            table = self.table or RouteTable(self.routes)
            self.openapi_schema = openapi_doc.finish(doc, table.policies())
        return self.openapi_schema


def _slash_redirect(table: RouteTable, scope: Scope) -> OrjsonResponse | None:
    """A path with a trailing slash whose route has none: 307 to it, with a body saying so."""
    path: str = scope["path"]
    bare = path.rstrip("/")
    if not bare or bare == path or table.find({**scope, "path": bare}).route is None:
        return None
    query = scope.get("query_string", b"").decode("latin-1")
    location = bare + (f"?{query}" if query else "")
    return OrjsonResponse(
        {
            "title": "Temporary Redirect",
            "status": 307,
            "detail": f"no route {path}: the route is {bare}, without the trailing slash",
            "location": location,
        },
        status_code=307,
        headers={"Location": location},
    )


def worker_count(settings: Settings) -> int:
    if settings.workers is not None:
        return settings.workers
    import torch

    return max(1, torch.cuda.device_count()) if torch.cuda.is_available() else 1


def create_app(settings: Settings | None = None, *, start_workers: bool = True) -> AttrServe:
    """Build the app; the worker pool starts with the app's lifespan."""
    settings = settings or Settings.from_env()
    sections = [op.section for op in OPERATIONS if op.section is not None]
    for section in sections:  # an operation's invalid setting stops the start, naming it
        settings.section(section)
    unclaimed = settings.unclaimed(sections)
    if unclaimed:
        raise SystemExit(f"attrserve: no setting is named {', '.join(unclaimed)}")
    try:
        specs = model_registry.load_specs(settings.models)
    except model_registry.RegistryError as exc:
        raise SystemExit(f"attrserve: cannot load the model registry: {exc}") from None
    for spec in specs:  # a models.toml explain or defaults that cannot run stops the start
        try:
            kserve.check_explanation(spec, settings)
            kinds.check_defaults(spec, settings)
        except ValueError as exc:
            raise SystemExit(f"attrserve: {exc}") from None
    telemetry = Telemetry()
    pool = WorkerPool(settings, specs, telemetry, worker_count(settings) if start_workers else 0)
    state = AppState(
        settings=settings,
        specs=pool.specs,  # one dict: the model repository's loads show everywhere
        pool=pool,
        telemetry=telemetry,
        method_names=frozenset(m.name for m in methods.available()),
    )

    if start_workers:
        try:
            answers = {op.operation: op for op in OPERATIONS}
            state.jobs = JobRunner(settings, state.specs, pool, telemetry, answers)
        except (OSError, sqlite3.Error) as exc:
            raise SystemExit(
                f"attrserve: cannot use ATTRSERVE_DATA_DIR={settings.data_dir!r} for attribution "
                f"jobs: {exc}"
            ) from None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        if settings.strict_start and pool.workers:
            await pool.settled()
            failed = {m: s for m, s in pool.states().items() if s["state"] != "ready"}
            if failed:
                await pool.stop()
                raise StartRefused(
                    "attrserve: not starting (ATTRSERVE_STRICT_START=1): "
                    + "; ".join(
                        f"model {m!r} did not load: {s['reason']}" for m, s in failed.items()
                    )
                )
        if state.jobs is not None:
            await state.jobs.start()
            for operation in OPERATIONS:  # with workers: what each operation serves from
                await operation.start(state)
        if pool.workers:
            # torch and the app leave a large heap of long-lived objects: keep them out of the
            # cyclic collector's way, so full collections stay cheap on the request path
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            if state.jobs is not None:
                for operation in reversed(OPERATIONS):
                    await operation.stop(state)
                await state.jobs.stop()
            await pool.stop()

    from service.core.version import __version__

    app = AttrServe(
        title="attrserve",
        version=__version__,
        description=DESCRIPTION,
        default_response_class=OrjsonResponse,
        lifespan=lifespan,
        docs_url=None,  # served from package files below, not a CDN: /docs works offline
        redoc_url=None,
    )
    app.state.attrserve = state
    problems.install(app)
    docs.install(app)
    for capability in CAPABILITIES:
        app.include_router(capability.router)
    inner: ASGIApp = BodyLimit(
        ApiKeys(app.dispatch, settings),
        max_bytes=settings.max_body_bytes,
        job_bytes=settings.max_job_body_bytes,
    )
    if settings.gzip_min_bytes is not None:
        inner = GZipMiddleware(
            inner, minimum_size=settings.gzip_min_bytes, compresslevel=settings.gzip_level
        )
    if settings.cors_origins:  # outside the keys: a browser's preflight carries none
        inner = CORSMiddleware(
            inner,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=[
                "authorization",
                "x-api-key",
                "content-type",
                "x-request-id",
                "x-deadline-ms",
                "inference-header-content-length",
                "traceparent",
            ],
            expose_headers=[
                "x-request-id",
                "retry-after",
                "inference-header-content-length",
                "traceresponse",
            ],
        )
    # every route is declared by now: the one table each request's route is found in (and the
    # OpenAPI document's security read from)
    app.table = RouteTable(app.routes)
    app.outer = RequestContext(inner, access=settings.access_log, routes=app.table)
    return app


__all__ = ["ServiceError", "create_app"]
