"""The service's one settings object, read from ``ATTRSERVE_*`` environment variables once.

Every field can be set as ``ATTRSERVE_<FIELD>`` (upper case); list and dict fields take JSON.
The object is frozen and passed down from ``create_app``; nothing else reads the environment.
``Settings`` holds what the server as a whole uses (binding, workers, queue, deadlines, shared
limits, keys, jobs); an operation's own settings are a ``Section`` in its folder, read from the
same variables (``settings.section(ContextSettings)``) and checked when the app is built.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

PREFIX = "ATTRSERVE_"

BatchSize = int | Literal["auto"] | None

S = TypeVar("S", bound="Section")


class Section(BaseModel):
    """An operation's own settings (``Capability.settings``): its fields are read from
    ``ATTRSERVE_<FIELD>`` like ``Settings``' own, so a section's variables are named as if the
    settings were one object; no section repeats a name of ``Settings``."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class ApiKey(BaseModel):
    """One API key (or its SHA-256 hex digest) and the models it may use (``*`` for all)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str | None = Field(default=None, description="the key itself")
    sha256: str | None = Field(
        default=None, description="hex SHA-256 of the key, instead of the key"
    )
    models: tuple[str, ...] = Field(default=("*",), description="model ids this key may use")

    def matches(self, presented: str) -> bool:
        """Constant-time comparison, so response times do not leak the key."""
        given = presented.encode("utf-8", "surrogateescape")
        if self.key is not None and hmac.compare_digest(
            self.key.encode("utf-8", "surrogateescape"), given
        ):
            return True
        if self.sha256 is not None:
            digest = hashlib.sha256(given).hexdigest()
            return hmac.compare_digest(digest, self.sha256.lower())
        return False

    def allows(self, model_id: str) -> bool:
        return "*" in self.models or model_id in self.models

    @property
    def owner(self) -> str:
        """Who owns the jobs this key submits: a digest of the key, never the key itself."""
        digest = (
            self.sha256.lower()
            if self.sha256
            else hashlib.sha256((self.key or "").encode("utf-8", "surrogateescape")).hexdigest()
        )
        return digest[:32]


class Settings(BaseModel):
    """Server settings; each is the environment variable ``ATTRSERVE_<NAME>``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="address `attrserve serve` binds")
    port: int = Field(default=8000, ge=0, le=65535, description="port `attrserve serve` binds")
    models: str | None = Field(
        default=None, description="models.toml path; unset serves the demo models"
    )
    workers: int | None = Field(
        default=None,
        ge=0,
        description="worker processes of each worker group whose models.toml entries do not "
        "say (unset: one per GPU, else one; 0: none)",
    )
    strict_start: bool = Field(
        default=False,
        description="any model that fails to load stops start-up (unset: it fails alone)",
    )
    queue_size: int = Field(
        default=64,
        ge=1,
        description="requests waiting for a worker before 429 (a split request counts once)",
    )
    max_backlog_s: float = Field(
        default=60.0,
        ge=0,
        description="estimated compute (seconds per worker) queued in a worker group beyond "
        "which a request costing more than one piece (split_ms), which would wait behind it "
        "all, gets 429 with Retry-After from the backlog, unless its own deadline leaves it "
        "longer; cheaper requests are never refused by it (0: no limit)",
    )
    retry_after_s: int = Field(default=1, ge=0, description="Retry-After seconds sent with 429")
    batching: bool = Field(default=True, description="merge compatible concurrent requests")
    batch_window_ms: float = Field(
        default=0.0,
        ge=0,
        description="extra wait for companions before an idle worker gets a batch (0: none)",
    )
    batch_max_cost: int = Field(
        default=8192, ge=1, description="largest merged batch, in estimated forward rows"
    )
    deadline_ms: float = Field(default=30000, gt=0, description="default per-request deadline")
    split_ms: float = Field(
        default=100.0,
        ge=0,
        description="an expensive request is split into pieces of about this much compute, "
        "and cheap work queues first (0: whole requests, first come first served)",
    )
    max_deadline_ms: float = Field(
        default=300000, gt=0, description="largest deadline a request may ask"
    )
    max_body_bytes: int = Field(
        default=16 << 20, ge=1, description="largest request body (413 above)"
    )
    max_tensor_elements: int = Field(
        default=4 << 20, ge=1, description="largest tensor in a request, in elements"
    )
    max_batch_size: int = Field(default=256, ge=1, description="most examples in one request")
    max_image_pixels: int = Field(
        default=40_000_000,
        ge=1,
        description="most pixels an image's header may declare: an upload, or a request's "
        "encoded images in all (413 above, before any is decoded)",
    )
    max_n_steps: int = Field(default=1024, ge=1, description="largest n_steps")
    max_n_samples: int = Field(default=1024, ge=1, description="largest n_samples / nt_samples")
    max_cost: int = Field(
        default=2_000_000, ge=1, description="largest estimated cost of a request, in forward rows"
    )
    # "auto": rows per chunk from the memory budget and what a row keeps for backward,
    # measured once per model, method and example shape (a fixed 512 rows needed ~24 GB for 8
    # BERT-base texts at 50 steps; on small models "auto" takes every row at once)
    internal_batch_size: BatchSize = Field(
        default="auto", description="default internal_batch_size (models may override)"
    )
    perturbations_per_eval: BatchSize = Field(
        default="auto", description="default perturbations_per_eval (models may override)"
    )
    verify_share: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="share of attributions computed in a low precision that are also "
        "computed in float32 and compared (fidelity); an answer out of tolerance is replaced",
    )
    max_internal_batch_size: int = Field(
        default=4096, ge=1, description="cap on internal_batch_size"
    )
    max_perturbations_per_eval: int = Field(
        default=4096, ge=1, description="cap on perturbations_per_eval"
    )
    memory_budget_bytes: int | None = Field(
        default=None,
        ge=1,
        description="working memory per engine call ('auto' batch sizes); unset: 1 GiB on the "
        "CPU, half the device's free memory at the call on a GPU",
    )
    torch_threads: int | None = Field(
        default=None,
        ge=1,
        description="torch threads of every worker, fixed (unset: the workers share the cores "
        "batch by batch: one thread for a small batch, the free cores for a big one)",
    )
    api_keys: tuple[ApiKey, ...] = Field(
        default=(), description='JSON list of {"key"|"sha256", "models"}; empty: no authentication'
    )
    admin_keys: tuple[ApiKey, ...] = Field(
        default=(),
        description="JSON list like api_keys: keys valid on every route, and the only ones "
        "the model repository routes (/v2/repository/...) take when keys are on",
    )
    log_level: str = Field(default="info", description="uvicorn log level")
    access_log: bool = Field(
        default=True, description="one JSON access-log line per request (id, model, status, ms)"
    )
    worker_mode: Literal["process", "thread"] = Field(
        default="process",
        description="process: each worker a process of its own (isolated, killable); thread: "
        "a thread of the server (for tests and development: no isolation, a stuck worker "
        "cannot be killed, torch's threads are the server's; service.pool.inthread)",
    )
    worker_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a worker silent this long (no heartbeat), or still busy this long after "
        "its work was cancelled, is killed and restarted",
    )
    shutdown_grace_s: float | None = Field(
        default=None,
        ge=0,
        description="on SIGTERM, how long in-flight work may finish before it gets 503 "
        "(unset: the default deadline)",
    )
    max_text_tokens: int = Field(default=512, ge=1, description="most tokens in one text (422)")
    max_target_tokens: int = Field(
        default=64, ge=1, description="causal LMs: most tokens in the answer attributed (422)"
    )
    max_features: int = Field(
        default=64, ge=1, description="causal LMs: most prompt features (tokens or slots) (422)"
    )
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="most open connections and tasks before the server answers 503 (unset: none)",
    )
    keep_alive_s: int = Field(
        default=5, ge=1, description="idle keep-alive connections are closed after this long"
    )
    data_dir: str = Field(
        default="./.attrserve", description="attribution jobs: their database and results"
    )
    job_ttl_s: float = Field(
        default=86400, gt=0, description="finished jobs and their results are removed after this"
    )
    max_job_body_bytes: int = Field(
        default=256 << 20, ge=1, description="largest attribution-job body (413 above)"
    )
    max_job_examples: int = Field(default=100_000, ge=1, description="most examples in one job")
    max_data_bytes: int = Field(
        default=10 << 30, ge=1, description="disk the jobs may use under data_dir (507 above)"
    )
    max_jobs_queued: int = Field(
        default=100, ge=1, description="jobs queued or running at once (429 above)"
    )
    job_chunk_cost: int = Field(
        default=131072,
        ge=1,
        description="a job's chunks hold at most about this many forward rows (chunks are "
        "sized by job_chunk_ms; the engine evaluates a chunk internal_batch_size rows at a time)",
    )
    job_chunk_ms: float = Field(
        default=100,
        gt=0,
        description="a job's chunks are sized to take about this long (a running chunk "
        "delays synchronous requests only while jobs are owed their share)",
    )
    job_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="share of worker time jobs are guaranteed while synchronous requests wait "
        "(0: jobs use only idle time and yield at once; above 0, a chunk owed its share runs "
        "to its end, delaying waiting requests by up to job_chunk_ms)",
    )
    cors_origins: tuple[str, ...] = Field(
        default=(),
        description="origins browsers may call from (comma-separated or a JSON list; '*' for "
        "any); empty: CORS off",
    )
    gzip_min_bytes: int | None = Field(
        default=16384,
        ge=1,
        description="gzip responses at least this large for clients that accept it (unset: off)",
    )
    gzip_level: int = Field(
        default=1,
        ge=1,
        le=9,
        description="gzip compression level (1: fastest; on 220 KB of attributions JSON, level 1 "
        "takes 4 ms for 48% of the size, level 9 29 ms for 43%)",
    )

    #: the ``ATTRSERVE_*`` values and overrides that are not fields here: the sections' values
    _rest: dict[str, Any] = PrivateAttr(default_factory=dict)
    #: the names of the overrides among them
    _overridden: frozenset[str] = PrivateAttr(default=frozenset())

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(o.strip() for o in value.split(",") if o.strip())
        return value

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        """Every key the server takes, admin keys first (empty: no authentication)."""
        return self.admin_keys + self.api_keys

    def is_admin(self, key: ApiKey | None) -> bool:
        """Whether ``key`` may use the model repository: an admin key, or any caller while
        the server has no keys."""
        return not self.keys if key is None else key in self.admin_keys

    @property
    def drain_s(self) -> float:
        """How long SIGTERM lets in-flight work finish."""
        return self.deadline_ms / 1e3 if self.shutdown_grace_s is None else self.shutdown_grace_s

    def section(self, kind: type[S]) -> S:
        """An operation's settings, read from the variables and overrides this was read from
        (``SystemExit`` naming the variable when one is invalid: ``create_app`` reads every
        operation's section, so a bad value stops the start)."""
        values = {name: self._rest[name] for name in kind.model_fields if name in self._rest}
        return _validated(kind, values)

    def unclaimed(self, sections: Iterable[type[Section]]) -> list[str]:
        """The overrides no field of these sections takes (a typo, or a setting of an
        operation that is not there): ``create_app`` refuses them."""
        taken = {name for kind in sections for name in kind.model_fields}
        return sorted(name for name in self._overridden if name not in taken)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every ``ATTRSERVE_*`` variable (JSON for structured fields); overrides win.
        Variables and overrides that are not fields here are kept for the sections."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        rest: dict[str, Any] = {}
        for var, raw in env.items():
            if not var.startswith(PREFIX):
                continue
            name = var[len(PREFIX) :].lower()
            field = cls.model_fields.get(name)
            if field is not None:
                values[name] = _parse(raw, field.annotation)
            else:
                rest[name] = _parse(raw, None)
        given = {k: v for k, v in overrides.items() if v is not None}
        values.update({k: v for k, v in given.items() if k in cls.model_fields})
        extra = {k: v for k, v in given.items() if k not in cls.model_fields}
        rest.update(extra)
        settings = _validated(cls, values)
        settings._rest = rest
        settings._overridden = frozenset(extra)
        return settings


M = TypeVar("M", bound=BaseModel)


def _validated(kind: type[M], values: dict[str, Any]) -> M:
    try:
        return kind.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        var = PREFIX + str(first["loc"][0]).upper() if first["loc"] else PREFIX
        raise SystemExit(f"invalid setting {var}: {first['msg']}") from None


def _parse(raw: str, annotation: Any) -> Any:
    text = raw.strip()
    if text == "" or text.lower() in ("none", "null"):
        return None
    if text[:1] in "[{":
        return json.loads(text)
    if text.lower() in ("true", "false") and annotation is bool:
        return text.lower() == "true"
    return text
