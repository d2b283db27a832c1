"""``remote:PROTOCOL``: a model served elsewhere (KServe, Triton, MLServer, a team's own server);
a forward is a call to its predictor.

Protocols: ``kserve-v1`` (``POST {url}/v1/models/{model_name}:predict`` with ``instances``),
``oip-v2`` (``POST {url}/v2/models/{model_name}/infer``, the Open Inference Protocol that
Triton, KServe and MLServer speak) and ``http`` (``POST {url}`` with a body template: the batch
goes where ``inputs_pointer`` points, the scores come from ``outputs_pointer``, JSON pointers).

Only forwards cross the network, so only the methods that need nothing else run on such a model
(the perturbation methods, and the metrics that evaluate forwards); the source declares it
(``differentiable = False``, ``hookable = False``) and the service refuses the others by name.
A forward of many rows (``perturbations_per_eval`` perturbations of the batch at once) is cut
into calls of at most ``max_batch`` instances, ``max_concurrency`` of them in flight. Each
call is retried on connection errors, timeouts, 429 and 5xx (``retries`` times, jittered
exponential back-off; a prediction is idempotent), and ``breaker_failures`` such failures in a
row open a circuit breaker: calls fail at once for ``breaker_cooldown_s``, then one call tries
again. What fails is the predictor's: ``RemoteFailure`` carries 502 (it answered wrongly or
not at all) or 504 (it timed out) and the upstream status, which the service answers with.
Header values may name environment variables (``"Bearer ${TOKEN}"``), read at load; they are
sent, never logged nor shown.
"""

from __future__ import annotations

import contextvars
import copy
import random
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from types import MappingProxyType
from typing import Any

import numpy as np
import orjson
import torch
from torch import nn

from methods import cancel
from methods.errors import AttributionError
from model_registry.errors import RegistryError
from model_registry.sources.base import ModelSource, Source, register
from model_registry.sources.remote_payloads import (
    Words,
    encode_images,
    pointer_get,
    pointer_put,
)
from model_registry.sources.remote_spec import RemoteSpec, expand, remote_spec
from model_registry.spec import InputSpec, LoadedModel, ModelSpec, OutputSpec
from model_registry.table import Table
from model_registry.tasks import DECLARED_TENSOR_TASKS, task_of

PROTOCOLS = ("kserve-v1", "oip-v2", "http")
#: the OIP datatype of each input dtype
DATATYPES = {
    "float32": "FP32",
    "float64": "FP64",
    "float16": "FP16",
    "int64": "INT64",
    "int32": "INT32",
    "bool": "BOOL",
}
#: what a model served elsewhere cannot be given in models.toml
_REFUSED = {
    key: f"a remote model runs on its predictor; it has no {what} here"
    for key, what in (
        ("weights", "weights file"),
        ("layers", "layers to hook"),
        ("embedding_layer", "embedding layer to hook"),
        ("compile", "module to compile"),
        ("compile_mode", "module to compile"),
        ("precision", "module to cast to a precision"),
        ("verify_device", "device to check"),
        ("influence", "training data to score"),
    )
}


class RemoteFailure(AttributionError):
    """The predictor failed: ``status`` is what the service answers (502, or 504 for a
    timeout), ``upstream`` the predictor's HTTP status (None: no answer). An engine error, not
    the model's own (``ModelError``): the engine passes it through as it is, and tries no
    other way of evaluating (each would call the failing predictor again)."""

    def __init__(self, message: str, status: int = 502, upstream: int | None = None) -> None:
        super().__init__(message, argument="model")
        self.status, self.upstream = status, upstream


JSON = {"content-type": "application/json"}


def plain(x: torch.Tensor) -> np.ndarray:
    """A tensor as the numpy array orjson writes (bfloat16, which numpy lacks, as float32)."""
    x = x.detach().cpu()
    return (x.float() if x.dtype == torch.bfloat16 else x).contiguous().numpy()


class Breaker:
    """Opens after ``failures`` failed calls in a row; stays open ``cooldown_s``; then lets
    one call through, closing on its success."""

    def __init__(self, failures: int, cooldown_s: float) -> None:
        self.failures, self.cooldown_s = failures, cooldown_s
        self.in_a_row = 0
        self.opened_at: float | None = None
        self.lock = threading.Lock()

    def check(self, what: str) -> None:
        with self.lock:
            if self.opened_at is None:
                return
            left = self.opened_at + self.cooldown_s - time.monotonic()
            if left > 0:
                raise RemoteFailure(
                    f"{what} failed {self.in_a_row} times in a row; not calling it for "
                    f"another {left:.0f} s (circuit breaker open)"
                )
            self.opened_at = None  # half-open: this call tries

    def record(self, ok: bool) -> None:
        with self.lock:
            if ok:
                self.in_a_row, self.opened_at = 0, None
                return
            self.in_a_row += 1
            if self.in_a_row >= self.failures:
                self.opened_at = time.monotonic()

    def state(self) -> str:
        with self.lock:
            return "open" if self.opened_at is not None else "closed"


class RemoteModel(nn.Module):
    """A model whose forward is a call to a remote predictor (no parameters, no gradients)."""

    def __init__(
        self,
        spec: ModelSpec,
        remote: RemoteSpec,
        headers: dict[str, str],
        words: Words | None = None,
    ) -> None:
        super().__init__()
        self.spec, self.remote, self.words = spec, remote, words
        self._headers = headers
        self.breaker = Breaker(remote.breaker_failures, remote.breaker_cooldown_s)
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.calls = 0
        self.last_error: str | None = None

    def __repr__(self) -> str:  # never the headers
        return f"RemoteModel({self.remote.describe()})"

    def _session(self) -> tuple[Any, ThreadPoolExecutor]:
        with self._lock:
            if self._client is None or self._pool is None:
                import httpx  # the worker that serves a remote model pays for the import

                limits = httpx.Limits(max_connections=self.remote.max_concurrency)
                self._client = httpx.Client(
                    timeout=self.remote.timeout_s, headers=self._headers, limits=limits
                )
                self._pool = ThreadPoolExecutor(self.remote.max_concurrency, "remote")
            return self._client, self._pool

    # -- one call ---------------------------------------------------------------------------

    def body(self, xs: tuple[torch.Tensor, ...]) -> Any:
        r, names = self.remote, [i.name for i in self.spec.inputs]
        if r.send != "tensors":
            if r.send == "text":
                if self.words is None:
                    raise RemoteFailure("a model that sends text needs its words (load it)")
                values: list[str] = self.words.texts(xs[0])
            else:
                values = encode_images(xs[0], r.send, r.pixel_max)
            if r.protocol == "oip-v2":
                data = {"name": names[0], "shape": [len(values)], "datatype": "BYTES"}
                return {"inputs": [{**data, "data": values}]}
            rows: Any = [{r.instance_key: v} if r.instance_key else v for v in values]
        elif r.protocol == "oip-v2":
            return {
                "inputs": [
                    {
                        "name": name,
                        "shape": list(x.shape),
                        "datatype": DATATYPES.get(str(x.dtype).removeprefix("torch."), "FP32"),
                        "data": plain(x.reshape(-1)),
                    }
                    for name, x in zip(names, xs, strict=True)
                ]
            }
        else:
            rows = (
                plain(xs[0])
                if len(xs) == 1
                else [
                    {name: plain(x[i]) for name, x in zip(names, xs, strict=True)}
                    for i in range(xs[0].shape[0])
                ]
            )
        if r.protocol == "kserve-v1":
            return {"instances": rows}
        return pointer_put(copy.deepcopy(dict(r.request_template)), r.inputs_pointer, rows)

    def scores(self, answer: Any, n: int) -> np.ndarray:
        r = self.remote
        try:
            if r.protocol == "oip-v2":
                outs = answer["outputs"]
                out = (
                    next(o for o in outs if o["name"] == r.output_name)
                    if r.output_name
                    else outs[0]
                )
                arr = np.asarray(out["data"], dtype=np.float64).reshape(out["shape"])
            else:
                key = "/predictions" if r.protocol == "kserve-v1" else r.outputs_pointer
                arr = np.asarray(pointer_get(answer, key), dtype=np.float64)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise RemoteFailure(
                f"{r.describe()} answered a body without its scores ({type(exc).__name__}: {exc})"
            ) from None
        want = tuple(d for d in self.spec.output.shape)
        shape = tuple(arr.shape)
        ok = shape[:1] == (n,) and len(shape) == 1 + len(want)
        ok = ok and all(w is None or w == s for w, s in zip(want, shape[1:], strict=True))
        if not ok:
            expected = "(" + ", ".join(
                str(d) for d in (n, *("*" if d is None else d for d in want))
            )
            raise RemoteFailure(
                f"{r.describe()} answered scores of shape {list(shape)} for {n} instances; "
                f"expected {expected})"
            )
        return arr

    def call(self, xs: tuple[torch.Tensor, ...]) -> np.ndarray:
        """One predictor call, retried; the scores of its rows."""
        import httpx

        client, _ = self._session()
        r, n = self.remote, int(xs[0].shape[0])
        # orjson writes numpy arrays ~20x faster than json writes nested lists: a CNN's
        # 64 rows of 3x32x32 pixels took 0.23 s per call that way, most of the time of a
        # feature ablation on a predictor on the same machine (``benchmarks.remote``)
        body = orjson.dumps(self.body(xs), option=orjson.OPT_SERIALIZE_NUMPY)
        failure: RemoteFailure | None = None
        for attempt in range(r.retries + 1):
            if attempt:
                time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random()))
                cancel.checkpoint()  # no retry starts after the request's deadline or cancellation
            self.breaker.check(r.describe())
            try:
                resp = client.post(r.endpoint(), content=body, headers=JSON)
            except httpx.TimeoutException:
                failure = RemoteFailure(
                    f"{r.describe()} did not answer within {r.timeout_s:g} s", status=504
                )
            except httpx.TransportError as exc:
                failure = RemoteFailure(f"{r.describe()} is unreachable ({type(exc).__name__})")
            else:
                if resp.status_code < 300:
                    try:
                        arr = self.scores(orjson.loads(resp.content), n)
                    except ValueError:
                        failure = RemoteFailure(
                            f"{r.describe()} answered a body that is not JSON",
                            upstream=resp.status_code,
                        )
                    except RemoteFailure as exc:  # an answer without the right scores
                        exc.upstream = resp.status_code
                        failure = exc
                    else:
                        self.breaker.record(True)
                        self.calls += 1
                        return arr
                    break  # a wrong answer is not retried: it would be wrong again
                text = " ".join(resp.text.split())[:200]
                failure = RemoteFailure(
                    f"{r.describe()} answered {resp.status_code}: {text}",
                    upstream=resp.status_code,
                )
                if resp.status_code != 429 and resp.status_code < 500:
                    break  # the predictor refused the request itself: again would be the same
            self.breaker.record(False)  # no answer, or 429/5xx: the predictor is in trouble
        if failure is None:  # unreachable: the loop returns or sets it
            failure = RemoteFailure(f"{r.describe()} gave no answer")
        self.last_error = str(failure)
        raise failure

    # -- a forward: many calls ---------------------------------------------------------------

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        n = int(xs[0].shape[0])
        step = self.remote.max_batch
        pieces = [(s, min(n, s + step)) for s in range(0, n, step)]
        _, pool = self._session()
        out: list[np.ndarray | None] = [None] * len(pieces)
        running: dict[Future[np.ndarray], int] = {}
        todo = list(enumerate(pieces))
        try:
            while todo or running:
                while todo and len(running) < self.remote.max_concurrency:
                    cancel.checkpoint()  # a cancelled request issues no more calls
                    i, (s, e) = todo.pop(0)
                    cut = tuple(x[s:e].detach().cpu() for x in xs)
                    # the call sees the request's cancellation scopes (its retries check them)
                    running[pool.submit(contextvars.copy_context().run, self.call, cut)] = i
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    out[running.pop(f)] = f.result()
        finally:
            for f in running:
                f.cancel()
        scores = np.concatenate([o for o in out if o is not None]) if out else np.zeros((0,))
        return torch.from_numpy(scores).to(torch.float32)


# -- the source -----------------------------------------------------------------------------


@register
class RemoteSource(ModelSource):
    name = "remote"
    syntax = "remote:kserve-v1|oip-v2|http"
    #: a remote predictor answers tensors: not a detector's detections
    tasks = (*(t for t in DECLARED_TENSOR_TASKS if t != "object_detection"), "text_classification")
    hookable = False
    differentiable = False
    local = False
    own_keys = (
        "url",
        "model_name",
        "headers",
        "timeout_s",
        "max_batch",
        "max_concurrency",
        "retries",
        "breaker_failures",
        "breaker_cooldown_s",
        "request_template",
        "inputs_pointer",
        "outputs_pointer",
        "scores_pointer",
        "output_name",
        "send",
        "instance_key",
        "words",
        "mask",
        "pixel_max",
    )
    refused = MappingProxyType(_REFUSED)

    def check_target(self, target: str) -> None:
        if target not in PROTOCOLS:
            raise ValueError(f"remote: takes one of {list(PROTOCOLS)}, got {target!r}")

    def defaults(self, table: Table, source: Source, task: str) -> ModelSpec | None:
        """A predictor that takes text: its input is the request's words (``Words``)."""
        if task != "text_classification":
            return None
        if "inputs" in table:
            table.fail("inputs", "a predictor that takes text is sent texts; remove this")
        return ModelSpec(
            id="",
            version="",
            description="",
            source="",
            device="cpu",
            dtype="float32",
            inputs=(InputSpec("text", "int64", (None, None)),),
            output=OutputSpec(shape=(None,)),
            task=task,
            texts_batch=True,  # each row is its own text: padding changes nothing
        )

    def spec(self, table: Table, source: Source) -> ModelSpec:
        from dataclasses import replace

        text = table.get("send") == "text"
        if text and table.get("kind", "tensor") != "text_classification":
            table.fail("kind", 'a predictor sent text is kind = "text_classification"')
        if table.get("kind") == "text_classification" and not text:
            table.fail("send", 'a text_classification predictor is sent text: send = "text"')
        if "inputs" not in table and not text:
            table.fail("inputs", "required for a remote model: what its predictor takes")
        spec = super().spec(table, source)
        return replace(spec, remote=remote_spec(table, source, spec))

    def load(self, spec: ModelSpec, source: Source, device: torch.device) -> LoadedModel:
        """The remote model, not called at load: a predictor that is down makes requests
        fail with 502 (and its health show it), not the server's start."""
        task_of(spec)  # the task must exist
        remote = spec.remote
        if remote is None:
            raise RegistryError("a remote model needs its remote keys", model=spec.id)
        headers = {name: expand(value, spec, name) for name, value in remote.headers.items()}
        words = Words(remote.words, remote.mask) if remote.send == "text" else None
        loaded = LoadedModel(
            spec=spec,
            model=RemoteModel(spec, remote, headers, words),
            device=torch.device("cpu"),
            tokenizer=words,
        )
        loaded.extra["source_kind"] = self.name
        return loaded


def health(model: Any) -> dict[str, Any] | None:
    """What a remote model's worker knows of its predictor (None: not a remote model)."""
    if not isinstance(model, RemoteModel):
        return None
    return {
        "predictor": model.remote.describe(),
        "breaker": model.breaker.state(),
        "failures_in_a_row": model.breaker.in_a_row,
        "calls": model.calls,
        "last_error": model.last_error,
    }
