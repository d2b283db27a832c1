"""Influence indexes (CONTRACT 7.4): one per model with a models.toml ``[models.influence]``,
built once per (model version, data, checkpoints, settings) digest as an attribution job of
its own kind (progress, restarts and cancellation as every job's), then assembled into one
file that every influence query reads.

Layout under ``data_dir``: ``influence/<model>/<digest>/`` holds ``job.json`` (the build's
job id), then ``index.pt`` (the index's tensors and metadata, ``InfluenceIndex.to_dict``),
``self.pt`` (each training example's self-influence, where the method defines it) and
``meta.json`` (n_train, bytes, when built). A digest whose ``index.pt`` exists is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import torch

from methods.data_influence import InfluenceIndex, index_self_influence
from model_registry.influence import InfluenceSpec, read_train_data
from model_registry.spec import ModelSpec
from service.core.errors import Conflict, NotFound, ServiceError
from service.core.files import atomic_write
from service.core.offload import offload
from service.core.settings import Settings
from service.core.work import new_id
from service.influence.work import InfluenceIndexPart
from service.jobs.runner import JobRunner
from service.serving.capability import Capability, Done

log = logging.getLogger("attrserve.influence")
#: how often building indexes are looked at (progress, assembly once their job finished)
POLL_S = 0.5
#: the owner of index jobs: the server itself (listed for callers without a key)
OWNER = ""


@dataclass
class IndexState:
    status: str  # "building", "ready", "failed"
    digest: str = ""
    job_id: str | None = None
    error: str | None = None
    progress: dict[str, int] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    self_scores: torch.Tensor | None = None

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "digest": self.digest, "job_id": self.job_id}
        if self.progress is not None:
            out["progress"] = self.progress
        if self.error is not None:
            out["error"] = self.error
        return {**out, **self.info}


class InfluenceIndexes:
    def __init__(self, settings: Settings, specs: dict[str, ModelSpec], runner: JobRunner) -> None:
        self.settings = settings
        self.specs = specs
        self.runner = runner
        self.states: dict[str, IndexState] = {}
        self._task: asyncio.Task[Any] | None = None

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Every served index found, followed or queued; one that cannot be is "failed" with
        the reason (the server starts regardless: its other routes do not need it)."""
        for spec in self.specs.values():
            if spec.influence is None:
                continue
            try:
                await self.ensure(spec)
            except Exception as exc:  # a full disk, a damaged job.json, the job queue full
                log.exception("attrserve: model %s: influence index", spec.id)
                why = (
                    exc.detail if isinstance(exc, ServiceError) else f"{type(exc).__name__}: {exc}"
                )
                self.states[spec.id] = IndexState("failed", error=why)
        self._task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    def root(self, spec: ModelSpec, digest: str) -> Path:
        base = Path(self.settings.data_dir) / "influence" / quote(spec.id, safe="")
        return base / digest

    async def ensure(self, spec: ModelSpec) -> IndexState:
        """The model's index: ready from disk, its build followed, or a build queued."""
        inf: InfluenceSpec = spec.influence
        try:
            digest = await offload(inf.digest, spec.version)
        except OSError as exc:
            state = self.states[spec.id] = IndexState("failed", error=f"{exc}")
            return state
        root = self.root(spec, digest)
        if (root / "meta.json").is_file():  # written last: the index and self.pt are whole
            info = json.loads((root / "meta.json").read_text())
            state = self.states[spec.id] = IndexState(
                "ready", digest, info.pop("job_id", None), info=info
            )
            return state
        job_file = root / "job.json"
        if job_file.is_file():
            job_id = json.loads(job_file.read_text())["job_id"]
            row = self.runner.store.get(job_id)
            if row is not None and row.status not in ("failed", "cancelled"):
                state = self.states[spec.id] = IndexState("building", digest, job_id)
                await self._refresh(spec, state)
                return state
        try:
            job = await offload(self._work, spec, inf)
        except (OSError, ValueError) as exc:
            state = self.states[spec.id] = IndexState("failed", digest, error=str(exc))
            log.error("attrserve: model %s: influence data cannot be read: %s", spec.id, exc)
            return state
        row = self.runner.queue_work(OWNER, spec, job, inf.batch_size * 4, INDEX_BUILD.operation)
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(job_file, lambda f: f.write(json.dumps({"job_id": row.id}).encode()))
        log.info("attrserve: model %s: building its influence index (job %s)", spec.id, row.id)
        state = self.states[spec.id] = IndexState(
            "building", digest, row.id, progress={"done": 0, "total": row.total}
        )
        return state

    def _work(self, spec: ModelSpec, inf: InfluenceSpec) -> InfluenceIndexPart:
        inputs, labels = read_train_data(spec, inf.train_data)
        return InfluenceIndexPart(
            id=new_id(),
            model_id=spec.id,
            n=len(labels),
            arrays=(*inputs, labels),
            study={
                "labels": True,
                "checkpoints": [list(c) for c in inf.checkpoints],
                "method": inf.method,
                "loss": inf.loss,
                "layers": None if inf.layers is None else list(inf.layers),
                "batch_size": inf.batch_size,
                "projection_dim": inf.projection_dim,
                "seed": inf.seed,
                "similarity": inf.similarity,
            },
            cost=len(labels),
        )

    # -- following builds ------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            for model_id, state in list(self.states.items()):
                spec = self.specs.get(model_id)
                if spec is not None and state.status == "building":
                    try:
                        await self._refresh(spec, state)
                    except Exception as exc:  # a bug: the index fails, the loop goes on
                        log.exception("attrserve: model %s: influence index", model_id)
                        state.status, state.error = "failed", f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(POLL_S)

    async def _refresh(self, spec: ModelSpec, state: IndexState) -> None:
        row = self.runner.store.get(state.job_id or "")
        if row is None:
            state.status, state.error = "failed", "the index's job is gone"
            return
        state.progress = {"done": row.done, "total": row.total}
        if row.status in ("failed", "cancelled"):
            err = (row.error or {}).get("detail") or row.status
            state.status, state.error = "failed", f"the index's job {row.status}: {err}"
        elif row.status == "succeeded":
            state.info = await offload(self._assemble, spec, state, row.total)
            state.status, state.progress = "ready", None

    def _assemble(self, spec: ModelSpec, state: IndexState, n_train: int) -> dict[str, Any]:
        """The finished job's chunks as one index file, its self-influence, its meta."""
        chunks = self.runner.store.read_chunks(state.job_id or "")
        study = json.loads(str(chunks[0]["meta"]))["study"]
        names = [*study["per_example"], *study["shared"]]
        tensors: dict[str, torch.Tensor] = {}
        for i, name in enumerate(names):
            key = f"attributions_{i}"
            if name in study["per_example"]:
                joined = np.concatenate([c[key] for c in chunks])
            else:  # every chunk's copy is the same: the first
                joined = chunks[0][key][: study["shared_rows"][name]]
            tensors[name] = torch.from_numpy(np.ascontiguousarray(joined))
        metadata = {**study["metadata"], "n_train": n_train}
        index = InfluenceIndex.from_dict({"tensors": tensors, "metadata": metadata})
        root = self.root(spec, state.digest)
        atomic_write(root / "index.pt", lambda f: torch.save(index.to_dict(), f))
        if index.method in ("tracin_cp", "tracin_cp_fast"):
            scores = index_self_influence(index)
            atomic_write(root / "self.pt", lambda f: torch.save({"scores": scores}, f))
        info = {
            "method": index.method,
            "n_train": n_train,
            "bytes": (root / "index.pt").stat().st_size,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        meta = json.dumps({**info, "job_id": state.job_id}).encode()
        atomic_write(root / "meta.json", lambda f: f.write(meta))
        log.info("attrserve: model %s: influence index ready (%s)", spec.id, info)
        return info

    # -- answering -------------------------------------------------------------------------
    def ready(self, spec: ModelSpec) -> tuple[IndexState, Path]:
        """The ready index's state and file, or why there is none (404, 409)."""
        state = self.states.get(spec.id)
        if spec.influence is None or state is None:
            raise NotFound(
                f"model {spec.id!r} serves no influence: its models.toml entry has no "
                "[models.influence] table",
                loc=("path", "model_id"),
            )
        if state.status != "ready":
            why = state.error if state.status == "failed" else f"progress {state.progress}"
            raise Conflict(
                f"model {spec.id!r}'s influence index is {state.status} ({why}); GET "
                f"/v1/models/{spec.id} follows it",
                loc=("path", "model_id"),
            )
        return state, self.root(spec, state.digest) / "index.pt"

    def self_influence(self, spec: ModelSpec, k: int) -> dict[str, Any]:
        state, path = self.ready(spec)
        if state.self_scores is None:
            self_file = path.parent / "self.pt"
            if not self_file.is_file():
                raise Conflict(
                    f"self-influence is not defined for {state.info.get('method')} (as in "
                    "Captum); serve tracin_cp or tracin_cp_fast",
                    loc=("path", "model_id"),
                )
            state.self_scores = torch.load(self_file, weights_only=True)["scores"]
        scores = state.self_scores
        top = torch.topk(scores, min(k, len(scores)))
        return {"indices": top.indices.tolist(), "scores": top.values.double().tolist()}


class IndexBuild(Capability[Any]):
    """An influence index's build: a job the server queues itself (no route), whose result
    says what it built; the index itself serves its model's influence routes."""

    operation = "influence-index"
    stem = "influence-index"
    chunked_result = False

    def answer(self, done: Done) -> dict[str, Any]:
        return {
            "model_id": done.spec.id,
            "method": done.work.name,
            "n_train": done.work.n,
            "served_by": f"/v1/models/{done.spec.id}/influence",
        }


INDEX_BUILD = IndexBuild()
