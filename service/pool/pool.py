"""The worker pool: one worker group per model (or per models.toml ``group``), routed by model.

Each group (``service.pool.group``) has its own worker processes, queue and supervision, so a
model that cannot load, crashes its worker or holds a request that will not stop touches no
other group. The pool routes each request to its model's group, says what state each model is
in (``states``), and changes what is served while it runs (the model repository): ``load``
starts a group with a model's new entry beside the one serving it and swaps them once the new
one is ready (a failed load leaves the old one serving); ``unload`` stops routing to a model,
and its group, once no model of it is routed, finishes the work it holds and stops.

Threads: every worker of every group shares the machine's cores, handed out per batch
(``service.pool.cores``: one thread for small batches, the free cores for big ones), unless
``ATTRSERVE_TORCH_THREADS`` fixes each worker's count; this process keeps one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from model_registry.spec import ModelSpec
from service.core.errors import LoadFailed, ModelUnavailable, NotReady, UnknownModel
from service.core.settings import Settings
from service.core.telemetry import Telemetry
from service.core.work import Work
from service.pool.cores import Cores
from service.pool.group import FAILED, LOADING, READY, Group
from service.pool.records import PREEMPTED, Entry, Worker
from service.worker import threads

__all__ = [
    "FAILED",
    "LOADING",
    "PREEMPTED",
    "READY",
    "UNLOADED",
    "Entry",
    "WorkerPool",
]

UNLOADED = "unloaded"
#: how long a repository load may take before it counts as failed
LOAD_TIMEOUT_S = 600.0


class WorkerPool:
    """``per_group``: worker processes of a group whose models do not say (models.toml
    ``workers``); 0 runs no workers at all (a server that only answers the catalogue)."""

    def __init__(
        self, settings: Settings, specs: list[ModelSpec], telemetry: Telemetry, per_group: int
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry
        self.per_group = per_group
        #: every model the server knows, served or unloaded, by id (shared with the app)
        self.specs: dict[str, ModelSpec] = {s.id: s for s in specs}
        #: the group serving each served model
        self.routes: dict[str, Group] = {}
        self.unloaded: set[str] = set()
        #: groups replaced or unloaded, finishing their work
        self._retiring: set[Group] = set()
        self._indices = 0
        self._draining = False
        self._repository = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.cores = Cores(
            threads.cpu_count(),
            settings.torch_threads,
            lambda: [w for g in (*self.groups, *self._retiring) for w in g.workers],
        )
        if per_group:
            members: dict[str, list[ModelSpec]] = {}
            for s in specs:
                members.setdefault(s.group_name, []).append(s)
            for name, group_specs in members.items():
                self._route(self._group(name, group_specs))

    # -- groups ----------------------------------------------------------------------------
    def _size(self, specs: list[ModelSpec]) -> int:
        return next((s.workers for s in specs if s.workers is not None), self.per_group)

    def _group(self, name: str, specs: list[ModelSpec]) -> Group:
        n = self._size(specs)
        first, self._indices = self._indices, self._indices + n
        return Group(
            name, self.settings, specs, self.telemetry, range(first, first + n), self.cores
        )

    def _route(self, group: Group) -> None:
        for s in group.specs:
            self.routes[s.id] = group

    @property
    def groups(self) -> list[Group]:
        """The groups serving models now (each once)."""
        return list(dict.fromkeys(self.routes.values()))

    @property
    def workers(self) -> list[Worker]:
        return [w for g in self.groups for w in g.workers]

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        if self.per_group:  # this process only parses and routes: it must not hog cores
            threads.limit(1)
        for g in self.groups:
            await g.start()

    async def drain(self, timeout: float) -> None:
        """Refuse new work, let queued and running work finish for up to ``timeout`` seconds,
        then answer what is left with 503."""
        self._draining = True
        await asyncio.gather(*(g.drain(timeout) for g in self.groups))

    async def stop(self) -> None:
        self._draining = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(g.stop() for g in [*self.groups, *self._retiring]))

    async def settled(self, groups: Iterable[Group] | None = None) -> None:
        """Wait (up to ``LOAD_TIMEOUT_S``) until no model of ``groups`` (None: the groups
        serving now) is still loading: each is ready or has failed."""
        waiting = list(self.groups if groups is None else groups)
        end = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < end and any(
            g.model_state(s.id)[0] == LOADING for g in waiting for s in g.specs
        ):
            await asyncio.sleep(0.05)

    # -- status ----------------------------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def ready(self) -> bool:
        """At least one model is ready (and the server is not shutting down)."""
        return not self._draining and any(self.state(m)[0] == READY for m in self.routes)

    def state(self, model_id: str) -> tuple[str, str | None]:
        """``(state, reason)``: "loading", "ready", "failed" or "unloaded"."""
        if model_id in self.unloaded:
            return UNLOADED, "unloaded"
        group = self.routes.get(model_id)
        if group is None:
            return (
                (FAILED, "this server runs no workers") if not self.per_group else (UNLOADED, None)
            )
        return group.model_state(model_id)

    def check(self, model_id: str) -> None:
        """503 at once, naming the model and why, for a model that failed (a server without
        workers checks the whole request first, then says it has none: ``submit``)."""
        state, reason = self.state(model_id)
        if state == FAILED and self.per_group:
            raise ModelUnavailable.of(
                model_id, reason, headers={"Retry-After": str(self.settings.retry_after_s)}
            )

    def model_ready(self, model_id: str) -> bool:
        return not self._draining and self.state(model_id)[0] == READY

    def states(self) -> dict[str, dict[str, Any]]:
        """Each known model's state, reason and group."""
        return {
            mid: {
                "state": state,
                "reason": reason,
                "group": spec.group_name,
                "predictor": self.routes[mid].predictors.get(mid) if mid in self.routes else None,
            }
            for mid, spec in self.specs.items()
            for state, reason in [self.state(mid)]
        }

    @property
    def model_info(self) -> dict[str, dict[str, Any]]:
        """What the workers report of each model they serve (device, compile, checks)."""
        return {
            mid: info
            for mid, group in self.routes.items()
            for info in [group.model_info.get(mid)]
            if info is not None
        }

    def queue_depth(self) -> int:
        return sum(g.queue_depth() for g in self.groups)

    def status(self) -> list[dict[str, Any]]:
        return [row for g in self.groups for row in g.status()]

    # -- requests --------------------------------------------------------------------------
    def submit(self, work: Work) -> Entry:
        if not self.per_group:
            raise NotReady("this server runs no workers")
        if self._draining:
            raise NotReady(
                "the server is shutting down",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )
        group = self.routes.get(work.model_id)
        if group is None:
            raise UnknownModel(
                f"model {work.model_id!r} is unloaded; load it again with "
                f"POST /v2/repository/models/{work.model_id}/load",
                loc=("path", "model_id"),
            )
        entry = group.submit(work)
        entry.group = group
        return entry

    def cancel(self, entry: Entry) -> None:
        if entry.group is not None:
            entry.group.cancel(entry)

    def rate(self, work: Work) -> float | None:
        """Measured compute per unit of cost (ms per forward row) of the job's model and
        method, from its recent batches; None before any."""
        group = self.routes.get(work.model_id)
        return None if group is None else group.costs.rate(work)

    # -- the model repository --------------------------------------------------------------
    async def load(self, spec: ModelSpec) -> None:
        """Serve ``spec`` (a changed or a new entry): its group starts anew beside the one
        serving now, with the group's other models as they are, and takes over once all of
        them are ready; if one is not, the new group stops and ``LoadFailed`` says why."""
        if not self.per_group:
            raise NotReady("this server runs no workers")
        async with self._repository:
            name = spec.group_name
            members = [
                self.specs[mid]
                for mid in self.routes
                if mid != spec.id and self.specs[mid].group_name == name
            ]
            members.append(spec)
            group = self._group(name, members)
            self._retiring.add(group)  # stopped with the pool if the server stops meanwhile
            await group.start()
            await self.settled([group])
            failed = {
                s.id: reason
                for s in members
                for state, reason in [group.model_state(s.id)]
                if state != READY
            }
            if failed:
                await group.stop()
                self._retiring.discard(group)
                raise LoadFailed(
                    "; ".join(
                        f"model {mid!r} failed to load: {why or 'it did not become ready'}"
                        for mid, why in failed.items()
                    )
                    + (
                        f"; version {self.specs[spec.id].version} serves on"
                        if spec.id in self.routes
                        else ""
                    )
                )
            self._retiring.discard(group)
            replaced = {self.routes[s.id] for s in members if s.id in self.routes}
            self.specs[spec.id] = spec
            self.unloaded.discard(spec.id)
            self._route(group)
            for old in replaced:
                self._retire(old)

    async def unload(self, model_id: str) -> None:
        """Stop serving ``model_id``: later requests get 404 naming it as unloaded, those in
        flight finish; its group stops once it serves no model."""
        async with self._repository:
            group = self.routes.pop(model_id, None)
            self.unloaded.add(model_id)
            if group is not None:
                self._retire(group)

    def _retire(self, group: Group) -> None:
        """Stop ``group`` once its work is done, unless it still serves a model."""
        if group in self.routes.values():
            return
        self._retiring.add(group)
        task = asyncio.get_running_loop().create_task(
            group.retire(self.settings.max_deadline_ms / 1e3)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._retiring.discard(group))
