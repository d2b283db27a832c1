"""Every shell and Python code block of docs/ runs, as written, against a live server: the
docs stay true (the README's run in order against ``make serve``: ``tests/test_readme.py``).

A block runs as a reader would paste it, with two substitutions only: the README's demo server
(``localhost:8000``) is the session's main server (tests/service/conftest.py: the built-in
models and the Hugging Face ones), and ``curl`` fails on an HTTP error (``--fail-with-body``),
so a 4xx answer fails the test instead of printing a problem document. A block that starts its
own server gets a free port instead of its own and a scratch directory instead of ``/tmp``,
and its processes are stopped after it. The markers a block may carry: ``tests/snippets.py``."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service.conftest import Server
from tests.snippets import (
    DEMO,
    DOCS,
    HTTP_ERROR,
    OWN_PORT,
    PREAMBLE,
    README,
    RUN,
    SHOWN,
    Block,
    blocks,
)

REPO = Path(__file__).resolve().parents[2]
ALL = [b for page in [README, *DOCS] for b in blocks(page)]
RUNNABLE = [b for page in DOCS for b in blocks(page) if b.lang in RUN]


def test_every_block_is_run_shown_or_skipped_with_a_reason() -> None:
    unknown = [b.name for b in ALL if b.lang not in RUN | SHOWN]
    assert unknown == [], f"blocks of a language the runner does not know: {unknown}"
    silent = [b.name for b in ALL if b.lang in RUN and b.mark == "skip" and not b.why]
    assert silent == [], f"skipped without saying why: {silent}"
    # the runners found them (the README's run in tests/test_readme.py)
    assert len([b for b in RUNNABLE if b.runs]) >= 10
    assert len([b for b in ALL if b.runs]) >= 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(HF_HUB_OFFLINE="1", ATTRSERVE_DATA_DIR=str(tmp / "data"), HOME=str(tmp))
    return env


def run_block(block: Block, server: Server, tmp: Path) -> subprocess.CompletedProcess[str]:
    url = server.url.removeprefix("http://")
    text = DEMO.sub(url, block.commands())
    env = _env(tmp)
    if block.mark == "own-server":  # its own port and scratch directory, stopped after
        port = str(_free_port())
        text = text.replace(OWN_PORT, port).replace("/tmp/", f"{tmp}/")
    if block.lang == "python":
        cmd = [sys.executable, "-c", text]
    else:
        cmd = ["bash", "-euo", "pipefail", "-c", PREAMBLE + text]
    log = tmp / "output.log"  # a file, not a pipe: a server left running would hold a pipe open
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO if block.lang == "python" else tmp,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):  # what it left running (a server, &)
                os.killpg(proc.pid, signal.SIGTERM)
    return subprocess.CompletedProcess(cmd, proc.returncode, log.read_text(errors="replace"), "")


@pytest.mark.processes  # each block a process
@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_block_runs(block: Block, server: Server, tmp_path: Path) -> None:
    if block.mark == "skip":
        pytest.skip(block.why)
    if block.lang != "python" and shutil.which("curl") is None and "curl" in block.text:
        pytest.fail("curl is missing (the docs use it; apt-get install curl)")
    done = run_block(block, server, tmp_path)
    if block.mark == "http-error":  # the block shows an error: curl's exit for an HTTP error
        shown = f"{block.name} did not fail as shown:\n{done.stdout[-3000:]}"
        assert done.returncode == HTTP_ERROR, shown
        assert "problem" in done.stdout or '"status"' in done.stdout, done.stdout[-3000:]
        return
    assert done.returncode == 0, f"{block.name} failed ({done.returncode}):\n{done.stdout[-3000:]}"
