"""Servers for the service's tests: the app served by uvicorn in a thread of this process, its
workers threads too (``serve_in_thread``: the pool's code path, no process started), or with
real worker processes (``worker_mode="process"``), or a real ``attrserve serve`` in a subprocess
(``start_server``). Only what a process is for (isolation, crashes, kills, restarts, signals)
starts one; such tests are marked ``processes`` (``make test-fast`` leaves them out)."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from model_registry.builtin.noisy import FILES as NOISY

REPO = Path(__file__).resolve().parents[2]

MODELS_TOML = """
[[models]]
id = "tabular-mlp"
source = "builtin:tabular-mlp"

[[models]]
id = "image-cnn"
source = "builtin:image-cnn"

[[models]]
id = "text-classifier"
source = "builtin:text-classifier"

[[models]]
id = "two-input"
source = "python:tests.service.factory:two_input"
labels = ["first", "second"]
inputs = [{ name = "a", dtype = "float32", shape = ["N", 3] },
          { name = "b", dtype = "float32", shape = ["N", 2] }]
explain = { method = "saliency", params = { abs = false } }

[[models]]
id = "slow"
source = "python:tests.service.factory:slow"
labels = ["a", "b"]
inputs = [{ name = "x", dtype = "float32", shape = ["N", 2] }]

[[models]]
id = "scripted"
source = "torchscript:scripted.pt"
labels = ["no", "yes"]
inputs = [{ name = "x", dtype = "float32", shape = ["N", 4] }]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running server: a subprocess (``process``: what lifecycle tests signal and kill) or
    an app in a thread of this process (``app_thread``), each with its own log file."""

    url: str
    process: subprocess.Popen[bytes] | None
    log: Path
    app_thread: AppThread | None = None

    def client(self, **kw: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60, **kw)  # type: ignore[arg-type]

    def ready(self) -> dict[str, object]:
        body: dict[str, object] = httpx.get(self.url + "/v1/health/ready", timeout=5).json()
        return body

    def exited(self) -> bool:
        if self.app_thread is not None:
            return not self.app_thread.thread.is_alive()
        return self.process is not None and self.process.poll() is not None

    def wait_ready(self, timeout: float = 90, *, every_model: bool = True) -> None:
        """Until /v1/health/ready is 200 (with ``every_model``, until every model is ready:
        the server is ready as soon as one is)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.exited():
                raise RuntimeError("server exited:\n" + self.log.read_text())
            try:
                r = httpx.get(self.url + "/v1/health/ready", timeout=2)
                if r.status_code == 200 and (not every_model or r.json()["status"] == "ready"):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError("server not ready:\n" + self.log.read_text())


class _ThreadLog(logging.Filter):
    """Only the records of one thread (an app thread's event loop): two apps in one process
    keep their logs apart."""

    def __init__(self) -> None:
        super().__init__()
        self.ident: int | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self.ident


@dataclass
class AppThread:
    server: Any  # service.http.server.GracefulServer
    thread: threading.Thread
    handler: logging.Handler

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(60)
        _detach(self.handler)


def _detach(handler: logging.Handler) -> None:
    for name in LOGGERS:
        logging.getLogger(name).removeHandler(handler)
    handler.close()


#: the loggers a served app writes (``attrserve serve`` sends them to its stderr)
LOGGERS = ("attrserve", "uvicorn")


@dataclass
class Restartable:
    """A server that a lifecycle test may stop and start again on the same data directory:
    later tests get the fresh one from ``current``."""

    tmp: Path
    settings: dict[str, object]
    current: Server

    def restart(self) -> Server:
        stop_server(self.current)
        self.current = serve_in_thread(self.tmp, **self.settings)  # type: ignore[arg-type]
        return self.current


def models_dir(tmp: Path, toml: str = MODELS_TOML) -> Path:
    (tmp / "models.toml").write_text(toml)
    torch.manual_seed(0)
    with warnings.catch_warnings():  # torch deprecates TorchScript; serving old files is the point
        warnings.simplefilter("ignore")
        from tests.service.factory import linear_script

        linear_script().save(str(tmp / "scripted.pt"))
    return tmp / "models.toml"


def start_server(
    tmp: Path,
    *,
    toml: str = MODELS_TOML,
    every_model: bool = True,
    env: dict[str, str] | None = None,
    **settings: object,
) -> Server:
    """A server for ``toml`` (a models.toml), ready (``every_model``: with every model), with
    ``env`` over the inherited environment.

    Its workers compute on one thread each unless ``torch_threads`` says otherwise (None: the
    server's own rule, ``service.pool.cores``)."""
    port = free_port()
    settings.setdefault("data_dir", tmp / "data")  # jobs: never in the working tree
    settings.setdefault("torch_threads", 1)
    # this process's HF_HUB_OFFLINE (tests/conftest.py) only where ``env`` asks for it
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    inherited.pop("HF_HUB_OFFLINE", None)
    env = inherited | (env or {})
    env.update({f"ATTRSERVE_{k.upper()}": str(v) for k, v in settings.items() if v is not None})
    log = tmp / f"server-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "service.cli.main",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models",
        str(models_dir(tmp, toml)),
    ]
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(f"http://127.0.0.1:{port}", proc, log)
    try:
        server.wait_ready(every_model=every_model)
    except Exception:
        proc.kill()
        raise
    return server


def serve_in_thread(
    tmp: Path, *, toml: str = MODELS_TOML, every_model: bool = True, **settings: object
) -> Server:
    """The app of ``start_server``, with the same settings, served by uvicorn in a thread of
    this process: no interpreter to start. Its workers are threads of this process too
    (``worker_mode="thread"``, ``service.pool.inthread``: the same pool, channel and worker
    loop, no process), unless ``worker_mode="process"``: real worker processes, forked from
    this process's forkserver, started once (for a test of what a process is for: a kill, a
    crash, a hung worker, per-process threads; its test is marked ``processes``).

    For every test that does not signal, kill or restart the server's own process; its log
    file gets what ``attrserve serve`` prints (the access log included). As in a served
    process, the pool's start leaves this process's torch on one thread (it only routes):
    a test that needs more sets them itself."""
    from service.app import create_app
    from service.cli.serving import server_for
    from service.core.settings import Settings

    port = free_port()
    settings.setdefault("data_dir", tmp / "data")
    settings.setdefault("torch_threads", 1)
    settings.setdefault("worker_mode", "thread")
    environ = {f"ATTRSERVE_{k.upper()}": str(v) for k, v in settings.items() if v is not None}
    config = Settings.from_env(
        environ, host="127.0.0.1", port=port, models=str(models_dir(tmp, toml))
    )
    log = tmp / f"server-{port}.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(logging.Formatter("%(message)s"))
    only = _ThreadLog()
    handler.addFilter(only)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
    try:
        graceful = server_for(create_app(config), config, keep_logging=True)
    except BaseException:
        _detach(handler)
        raise

    def run() -> None:
        only.ident = threading.get_ident()  # before uvicorn's first line
        graceful.run()

    thread = threading.Thread(target=run, name=f"app-{port}", daemon=True)
    thread.start()
    app_thread = AppThread(graceful, thread, handler)
    server = Server(f"http://127.0.0.1:{port}", None, log, app_thread)
    try:
        server.wait_ready(every_model=every_model)
    except Exception:
        app_thread.stop()
        raise
    return server


def stop_server(server: Server) -> None:
    if server.app_thread is not None:
        server.app_thread.stop()
        return
    assert server.process is not None
    server.process.terminate()
    try:
        server.process.wait(15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(5)


#: served by the main server beside MODELS_TOML, for tests/service/kinds/test_hf_images.py,
#: tests/service/attributions/test_generation_http.py and the explorer's influence view
#: (tabular-noisy: its built-in influence index) (one server start instead of four)
EXTRA_TOML = """
[[models]]
id = "flowers"
source = "hf:flowers"
dtype = "float64"

[[models]]
id = "cropped"
source = "hf:cropped"

[[models]]
id = "tiny-lm"
source = "builtin:tiny-lm"

[[models]]
id = "gpt2-dir"
source = "hf:gpt2-dir"
dtype = "float64"

[[models]]
id = "bart-dir"
source = "hf:bart-dir"
dtype = "float64"

[[models]]
id = "tabular-noisy"
source = "builtin:tabular-noisy"
"""


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The main server: one worker, batching on with a window wide enough to merge reliably;
    beside MODELS_TOML, Hugging Face directories (two ViT image classifiers, a GPT-2, a BART) and
    tiny-lm, whose targets are capped at 6 tokens."""
    from tests.hf_dirs import vit_dir
    from tests.methods.test_generation import gpt2, gpt2_tokenizer
    from tests.methods.test_generation_chat import chat_tokenizer
    from tests.methods.test_generation_seq2seq import seq2seq

    tmp = tmp_path_factory.mktemp("main")
    vit_dir(tmp / "flowers")
    vit_dir(tmp / "cropped", processor="crop")
    gpt2().save_pretrained(tmp / "gpt2-dir")
    chat_tokenizer().save_pretrained(tmp / "gpt2-dir")  # with a chat template
    seq2seq("bart").save_pretrained(tmp / "bart-dir")  # an encoder-decoder
    gpt2_tokenizer().save_pretrained(tmp / "bart-dir")
    s = serve_in_thread(
        tmp, toml=MODELS_TOML + EXTRA_TOML, workers=1, batch_window_ms=25, max_target_tokens=6
    )
    yield s
    stop_server(s)


@pytest.fixture(scope="session")
def tight_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with a tiny queue and no batching: for 429, 504 and a killed worker (a worker
    process: its tests are marked ``processes``, tests/conftest.py)."""
    keys = '[{"key": "k-tight", "models": ["tabular-mlp", "image-cnn", "slow"]}]'
    s = serve_in_thread(
        tmp_path_factory.mktemp("tight"),
        workers=1,
        queue_size=1,
        batching="false",
        api_keys=keys,
        worker_mode="process",
    )
    yield s
    stop_server(s)


#: keys of ``keyed_server``: k-a and k-b for every model (tests/service/jobs/test_jobs.py), and
#: the explorer's, for tabular-mlp only (tests/service/explorer/test_explorer.py)
KEYED_KEYS = (
    '[{"key": "k-a", "models": ["*"]}, {"key": "k-b", "models": ["*"]},'
    ' {"key": "k-explorer", "models": ["tabular-mlp"]}]'
)


@pytest.fixture(scope="session")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server behind API keys (KEYED_KEYS) whose jobs are cut in chunks of cost 256."""
    tmp = tmp_path_factory.mktemp("keyed")
    s = serve_in_thread(tmp, workers=1, api_keys=KEYED_KEYS, job_chunk_cost=256)
    yield s
    stop_server(s)


#: models of ``store_server``: concepts (tests/service/concepts) on image-cnn, training-data
#: influence (tests/service/influence) on tabular-noisy and "projected", none on tabular-mlp;
#: "projected" has integrated gradients default to n_steps "auto"
#: (tests/service/attributions/test_defaults.py)
STORE_TOML = f"""
[[models]]
id = "image-cnn"
source = "builtin:image-cnn"

[[models]]
id = "tabular-mlp"
source = "builtin:tabular-mlp"

[[models]]
id = "tabular-noisy"
source = "builtin:tabular-noisy"

[[models]]
id = "projected"
source = "builtin:tabular-noisy"

[models.influence]
train_data = "{NOISY / "train.npz"}"
checkpoints = [{{ path = "{NOISY / "checkpoint-2.pt"}", lr = 0.1 }},
               {{ path = "{NOISY / "checkpoint-3.pt"}", lr = 0.05 }}]
method = "tracin_cp_fast_rand_proj"
projection_dim = 2
seed = 3

[models.defaults.integrated_gradients]
n_steps = "auto"
"""


@pytest.fixture(scope="session")
def store_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restartable]:
    """A server of what persists in its data directory (concept sets, CAVs, influence indexes),
    that the lifecycle tests restart on the same directory."""
    tmp = tmp_path_factory.mktemp("store")
    settings: dict[str, object] = {"toml": STORE_TOML, "workers": 1}
    s = Restartable(tmp, settings, serve_in_thread(tmp, **settings))  # type: ignore[arg-type]
    yield s
    stop_server(s.current)
