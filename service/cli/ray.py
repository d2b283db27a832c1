"""Scale-out on Ray: ``attrserve ray serve`` (Ray Serve) and ``attrserve attribute --ray``
(Ray Data). Ray is an optional extra (``attrserve[ray]``) and is imported only in here.

Serve: each Ray Serve replica runs the very app ``attrserve serve`` runs. The replica builds
``create_app(settings)`` itself (``__serve_build_asgi_app__``: the app, its worker pool and
models are made in the replica, never pickled) and Ray Serve runs the app's lifespan there,
which starts the pool: one worker process per GPU the replica was given, else one, with the
models resident. Requests come from Ray Serve's HTTP proxy as ASGI calls to
``AttrServe.__call__``, so our middleware (request id, body limit, API keys), the attribution
fast path and the problem+json errors all run as in ``attrserve serve``.

Batching: our own merging inside each replica's pool is kept, not Ray Serve's
``@serve.batch``. The pool merges requests whose method, params and shapes may share one
engine call (the method registry's merge key) and sizes batches by estimated cost;
``@serve.batch`` only collects calls to one Python method up to a count, knows nothing of which
requests may share an engine call, and needs a handle-called method, not the HTTP app: it would
take a second request path beside FastAPI's. So that merging can happen, a replica takes up to
``queue_size`` requests at once (Ray Serve's default is 5).

Data: ``attribute`` reads the file on the driver (``service.cli.offline.read_examples``), spreads
the examples over a Ray Data dataset and ``map_batches`` them through ``Attributor`` actors,
each of which loads the model once; ``service.cli.offline.attribute_batch`` computes, and the
driver writes the rows, in order, with ``service.cli.offline.write_output``: the same file as the
local ``attrserve attribute``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import pickle
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.settings import Settings

if TYPE_CHECKING:
    from model_registry.spec import ModelSpec
    from service.app import AttrServe
    from service.pool.pool import WorkerPool

log = logging.getLogger("attrserve.ray")

APP_NAME = "attrserve"


#: CPUs a replica asks of Ray; its worker computes on as many torch threads (unless
#: ATTRSERVE_TORCH_THREADS says otherwise): scale out with replicas, one per core or GPU
CPUS_PER_REPLICA = 1
#: how long a replica's workers may take to load the models before its start fails
READY_TIMEOUT_S = 120.0


class Replica:
    """One Ray Serve replica: builds the app (and so its worker pool) in the replica process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def __serve_build_asgi_app__(self) -> ASGIApp:
        import ray

        from service.app import create_app

        settings = self.settings
        if settings.torch_threads is None:  # the replica's CPUs, not every core of the node
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1)
            settings = settings.model_copy(update={"torch_threads": max(1, int(cpus))})
        return InReplica(create_app(settings))


class InReplica:
    """The app as a replica runs it; two differences from ``attrserve serve``, both owed to
    Ray Serve:

    - the lifespan's startup completes only once every model has loaded or failed
      (``lifespan.startup.failed`` if none is ready, or any failed under
      ``ATTRSERVE_STRICT_START``), so Ray routes no request to a replica that
      cannot compute yet, and a new replica (autoscaling) joins only when it is ready;
    - the response's ``X-Request-ID`` is left to Ray's HTTP proxy, which adds the request's own
      (the caller's, or one it made up and passed to us) to every response: ours as well would
      send the header twice.
    """

    def __init__(self, app: AttrServe) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._when_ready(send))
        elif scope["type"] == "http":
            given = Headers(scope=scope).get("x-request-id")
            await self.app(scope, receive, _without_id(send, given) if given else send)
        else:
            await self.app(scope, receive, send)

    def _when_ready(self, send: Send) -> Send:
        pool: WorkerPool = self.app.state.attrserve.pool

        async def send_when_ready(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                try:
                    await asyncio.wait_for(pool.settled(), READY_TIMEOUT_S)
                    why = None if pool.ready else "no model loaded"
                except TimeoutError:
                    why = "timed out"
                strict = self.app.state.attrserve.settings.strict_start
                failed = [m for m, s in pool.states().items() if s["state"] == "failed"]
                if why is None and strict and failed:
                    why = f"ATTRSERVE_STRICT_START=1 and model(s) {failed} failed to load"
                if why is not None:
                    message = {
                        "type": "lifespan.startup.failed",
                        "message": f"attrserve: the replica could not start ({why})",
                    }
            await send(message)

        return send_when_ready


def _without_id(send: Send, given: str) -> Send:
    """``send`` without our ``x-request-id`` where it is the request's (Ray adds that one)."""
    ours = given.encode()

    async def send_without_id(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", [])
            kept = [(k, v) for k, v in headers if not (k == b"x-request-id" and v == ours)]
            if len(kept) != len(headers):
                message = {**message, "headers": kept}
        await send(message)

    return send_without_id


def deployment_options(
    settings: Settings,
    *,
    replicas: int | None = None,
    gpus_per_replica: float = 0,
    min_replicas: int | None = None,
    max_replicas: int | None = None,
) -> dict[str, Any]:
    """Ray Serve deployment options: a fixed replica count, or autoscaling when a minimum or a
    maximum is given; ``gpus_per_replica`` GPUs for each (a replica's pool starts one worker per
    GPU it sees)."""
    options: dict[str, Any] = {
        "name": APP_NAME,
        "ray_actor_options": {"num_cpus": CPUS_PER_REPLICA, "num_gpus": gpus_per_replica},
        "max_ongoing_requests": settings.queue_size,
        # a stopping replica's in-flight requests get drain_s to finish, as under `serve`;
        # the pool answers what is left with 503
        "graceful_shutdown_timeout_s": settings.drain_s + 5,
    }
    if min_replicas is not None or max_replicas is not None:
        low = min_replicas if min_replicas is not None else 1
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": max_replicas if max_replicas is not None else max(low, 1),
            # a few requests per replica keep its merged batches full before another starts
            "target_ongoing_requests": max(2, settings.queue_size // 4),
        }
    else:
        options["num_replicas"] = replicas if replicas is not None else 1
    return options


def application(settings: Settings, **options: Any) -> Any:
    """The Ray Serve application: ``Replica`` as an ingress deployment with ``options``."""
    from ray import serve

    deployment = serve.deployment(**deployment_options(settings, **options))
    return deployment(serve.ingress()(Replica)).bind(settings)


def app_builder(args: dict[str, Any]) -> Any:
    """For ``serve run service.cli.ray:app_builder`` and a RayService's ``import_path``:
    settings from the replica's ``ATTRSERVE_*`` environment; ``args`` (the config's ``args``)
    may set ``replicas``, ``gpus_per_replica``, ``min_replicas``, ``max_replicas``, ``models``."""
    settings = Settings.from_env(models=args.get("models"))
    options = {
        k: _number(args[k])
        for k in ("replicas", "gpus_per_replica", "min_replicas", "max_replicas")
        if args.get(k) is not None
    }
    return application(settings, **options)


def _number(value: Any) -> int | float:
    number = float(value)
    return int(number) if number.is_integer() else number


def _init(address: str | None) -> None:
    """Connect to the cluster at ``address`` (unset: ``RAY_ADDRESS``, else a new local one),
    unless this process is connected already (a test, a notebook)."""
    import ray

    if not ray.is_initialized():
        ray.init(address=address, logging_level=logging.WARNING)


def _cluster_gpus() -> float:
    import ray

    return float(ray.cluster_resources().get("GPU", 0))


def serve(args: argparse.Namespace) -> int:
    """``attrserve ray serve``: deploy the app on Ray Serve and block until interrupted."""
    from ray import serve as ray_serve

    models = getattr(args, "models", None)
    settings = Settings.from_env(
        models=str(Path(models).resolve()) if models else None,
        host=getattr(args, "host", None),
        port=getattr(args, "port", None),
    )
    _init(getattr(args, "address", None))
    gpus = _cluster_gpus()
    per = getattr(args, "gpus_per_replica", None)
    per = float(per) if per is not None else (1.0 if gpus else 0.0)
    replicas = getattr(args, "replicas", None)
    if replicas is None and per:
        replicas = max(1, int(gpus // per))  # one replica per GPU (per G GPUs)
    app = application(
        settings,
        replicas=replicas,
        gpus_per_replica=per,
        min_replicas=getattr(args, "min_replicas", None),
        max_replicas=getattr(args, "max_replicas", None),
    )
    ray_serve.start(http_options={"host": settings.host, "port": settings.port})
    ray_serve.run(app, name=APP_NAME, route_prefix="/")
    log.warning("attrserve on Ray Serve: http://%s:%d", settings.host, settings.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    ray_serve.delete(APP_NAME)
    return 0


# ------------------------------------------------------------------------------ Ray Data


class Attributor:
    """A Ray Data actor: loads the model once, then attributes whole chunks (one row each).

    A chunk's refusal (a ServiceError) comes back as data, described, and the driver reports
    the first, as the local command does; anything else fails the job.
    """

    def __init__(self, spec: ModelSpec, settings: Settings) -> None:
        import torch

        import model_registry

        torch.set_num_threads(1)  # each actor is given one CPU: the cluster's cores, one each
        self.spec, self.settings = spec, settings
        self.model = model_registry.load(spec)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        from service.cli import offline
        from service.core.errors import ServiceError

        out: dict[str, list[Any]] = {"chunk": [], "result": [], "actor": []}
        for k, payload in zip(batch["chunk"], batch["payload"], strict=True):
            request, examples, span = pickle.loads(payload)
            try:
                cols = offline.attribute_batch(
                    self.model, self.spec, request, examples, self.settings
                )
                result: Any = ("ok", cols)
            except ServiceError as err:
                result = ("error", offline.describe(err, span))
            out["chunk"].append(int(k))
            out["result"].append(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
            out["actor"].append(os.getpid())
        return {
            "chunk": np.array(out["chunk"]),
            "result": np.array(out["result"], dtype=object),
            "actor": np.array(out["actor"]),
        }


def attribute(args: argparse.Namespace) -> int:
    """``attrserve attribute --ray``: the local command's chunks, attributed by Ray Data actors
    across the cluster (one GPU each where the cluster has GPUs), written by the driver in
    order. Resumable as the local command is: finished chunks are kept as they arrive."""
    from service.cli import offline
    from service.core.errors import ServiceError

    try:  # every check the local command makes, before Ray starts
        plan = offline.plan_run(args)
    except ServiceError as err:
        offline.say(f"error: {offline.describe(err)}")
        return 2
    progress, n, size = plan.progress, plan.examples.n, plan.chunk
    total = math.ceil(n / size)
    note = progress.open()
    if note and not args.quiet:
        offline.say(note)
    _init(getattr(args, "address", None))
    import ray

    if args.quiet:
        ray.data.DataContext.get_current().enable_progress_bars = False
    rows = []
    for k in range(progress.done, total):
        start, stop = k * size, min(n, (k + 1) * size)
        work = (plan.request_for(start, stop), plan.examples.slice(start, stop), (start, stop))
        rows.append({"chunk": k, "payload": pickle.dumps(work, protocol=pickle.HIGHEST_PROTOCOL)})
    gpus = _cluster_gpus()
    actors = max(1, min(len(rows), int(gpus) if gpus else int(_cluster_cpus())))
    # one block per chunk, and every actor started at once: with the default blocks (few, for
    # a small item list) and a pool growing from one actor, the first actor, already loaded,
    # took every block before a second one had started
    results = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
        Attributor,
        fn_constructor_args=(plan.spec, plan.settings),
        batch_size=1,
        batch_format="numpy",
        compute=ray.data.ActorPoolStrategy(min_size=actors, max_size=actors),
        num_cpus=1,
        num_gpus=1 if gpus else 0,
    )
    # chunks arrive in any order; they are kept in order (a rerun resumes after them), and a
    # refusal is reported once every chunk before it is kept: what the local command leaves
    finished: dict[int, Any] = {}
    refused: tuple[int, str] | None = None
    actors_seen: set[int] = set()
    for row in results.iter_rows():
        k = int(row["chunk"])
        actors_seen.add(int(row["actor"]))
        status, value = pickle.loads(row["result"])
        if status == "error" and (refused is None or k < refused[0]):
            refused = (k, value)
        elif status == "ok":
            finished[k] = value
        while progress.done in finished:
            progress.save(progress.done, finished.pop(progress.done))
        if refused is not None and progress.done == refused[0]:
            break
    if refused is not None:
        offline.say(f"error: {refused[1]}")
        if progress.done:
            offline.say(f"{progress.done} finished chunks are kept in {progress.dir}/")
        return 2
    if progress.done != total:
        raise RuntimeError(f"Ray Data returned {progress.done} of {total} chunks")
    offline.write_output(args.output, list(progress.chunks()))
    progress.remove()
    if not args.quiet:
        offline.say(
            f"wrote {n} examples to {args.output} ({len(rows)} chunks on "
            f"{len(actors_seen)} of {actors} Ray Data actors)"
        )
    return 0


def _cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 1))


__all__ = ["APP_NAME", "Replica", "app_builder", "application", "attribute", "serve"]
