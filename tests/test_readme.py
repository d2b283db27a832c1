"""The README's walk-through runs as a new reader runs it: ``make serve`` in one terminal, and
in a second one, from the clone, every shell and Python block in order, verbatim, in one shell
session: what a block sets (``source .venv/bin/activate``) holds for the blocks after it, and
the session starts without the venv on its PATH, as a new terminal does.

The substitutions are those of ``tests/service/test_snippets.py`` (``tests/snippets.py``): a
free port for ``make serve``'s 8000 (``make serve PORT=...``) and for the Hugging Face server's
8001, a scratch directory for ``/tmp/``, and curl failing on an HTTP error. A Python block is
pasted into the session's ``python``. A block that cannot run here (an install, a server in the
foreground) says so in the README, ``<!-- snippet: skip: <why> -->``; the README's first block
is ``make serve``, which this test runs itself.

``make serve`` runs in the developer's checkout and ``.venv``, as the README has it; it must
plan no install (``make install`` ran: ``make test`` sees to it), so that no ``pip`` touches
the venv while other tests use it. Jobs and influence indexes go to a scratch
``ATTRSERVE_DATA_DIR``, never into the working tree."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.conftest import free_port
from tests.snippets import DEMO, HTTP_ERROR, OWN_PORT, PREAMBLE, README, REPO, Block, blocks

#: a line the session prints before each block: ``@@ README.md:LINE SECONDS``
BEGIN = "@@"
#: the whole walk-through's limit, and the server's until every model and the influence index
#: are ready (both far above what they take: ~60 s and ~20 s on 2 idle cores)
SESSION_TIMEOUT_S = 420
READY_TIMEOUT_S = 240

pytestmark = [
    pytest.mark.processes,  # make serve and the README's blocks
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.timeout(SESSION_TIMEOUT_S + READY_TIMEOUT_S + 60),
]


@dataclass
class MakeServe:
    """``make serve`` on a free port: its process group, its address and its log."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def get(self, path: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.port}{path}"
        with urllib.request.urlopen(url, timeout=5) as answer:
            body: dict[str, object] = json.load(answer)
        return body

    def ready(self) -> bool:
        """Every model ready, and tabular-noisy's influence index built (the reader finds it
        so by the time they reach it: ``GET /v1/models/tabular-noisy`` says so)."""
        try:
            if self.get("/v1/health/ready").get("status") != "ready":
                return False
            influence = self.get("/v1/models/tabular-noisy").get("influence")
        except OSError:  # not listening yet, or 503 until a model is ready
            return False
        return isinstance(influence, dict) and influence.get("status") == "ready"


def reader_env(tmp: Path) -> dict[str, str]:
    """A new terminal's environment: no venv on the PATH, no ATTRSERVE_ settings; jobs and
    the home directory in ``tmp``, and the Hugging Face hub offline (no network here)."""
    venv_bins = {Path(sys.executable).parent.resolve(), (REPO / ".venv" / "bin").resolve()}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ATTRSERVE_", "MAKE"))
        and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    env["PATH"] = os.pathsep.join(p for p in path if Path(p).resolve() not in venv_bins)
    (tmp / "home").mkdir(exist_ok=True)
    env.update(HOME=str(tmp / "home"), ATTRSERVE_DATA_DIR=str(tmp / "data"), HF_HUB_OFFLINE="1")
    return env


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to ``process``'s group (make and the server, or the session and what it left
    running: the Hugging Face server it put in the background), SIGKILL after 20 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(5)


@pytest.fixture(scope="module")
def make_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MakeServe]:
    tmp = tmp_path_factory.mktemp("readme")
    env = reader_env(tmp)
    planned = subprocess.run(
        ["make", "--no-print-directory", "-n", "serve"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if "pip" in planned.stdout:  # another test may be using the venv that pip would rewrite
        pytest.fail(f"make serve would install first: run `make install`:\n{planned.stdout}")
    port = free_port()
    log = tmp / "make-serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "serve", "HOST=127.0.0.1", f"PORT={port}"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    server = MakeServe(process, port, log)
    try:
        end = time.monotonic() + READY_TIMEOUT_S
        while not server.ready():
            if process.poll() is not None or time.monotonic() > end:
                pytest.fail(f"make serve did not get ready:\n{log.read_text()[-5000:]}")
            time.sleep(0.5)
        yield server
    finally:
        stop(process)


def session(walk: list[Block], port: int, own_port: int, tmp: Path) -> str:
    """The blocks as one bash script, from the clone, each announced by a ``BEGIN`` line."""
    lines = ["set -euo pipefail", PREAMBLE.rstrip(), f"cd {shlex.quote(str(REPO))}"]
    for i, block in enumerate(walk):
        text = DEMO.sub(f"localhost:{port}", block.commands())
        text = re.sub(rf"(?<=[:\s]){OWN_PORT}\b", str(own_port), text)  # :8001, --port 8001
        text = text.replace("/tmp/", f"{tmp}/")
        if block.lang == "python":  # pasted into the reader's python
            end = f"README_BLOCK_{i}"
            text = f"python - <<'{end}'\n{text}{end}\n"
        if block.mark == "http-error":  # it must get one: curl's status for an HTTP error
            text = (
                f"set +e\n(\n{text})\nrc=$?\nset -e\n"
                f'[ "$rc" -eq {HTTP_ERROR} ] || {{ echo "expected an HTTP error, got $rc"; '
                "exit 1; }\n"
            )
        lines += [announce(block.name), text.rstrip()]
    lines.append(announce("end"))
    return "\n".join(lines) + "\n"


def announce(name: str) -> str:
    """The line before a block (on a line of its own: curl's answers end without one)."""
    return f'printf "\\n{BEGIN} {name} %d\\n" "$SECONDS"'


def timings(output: str) -> str:
    """Each block's seconds, from the ``BEGIN`` lines of the session's output."""
    marks = re.findall(rf"^{BEGIN} (\S+) (\d+)$", output, re.M)
    return ", ".join(
        f"{name} {int(b) - int(a)} s" for (name, a), (_, b) in itertools.pairwise(marks)
    )


README_BLOCKS = blocks(README)


def test_the_first_block_is_make_serve_which_the_test_runs() -> None:
    first = next(b for b in README_BLOCKS if b.lang != "")
    assert first.text.startswith("make serve") and first.mark == "skip", first
    # the reader's terminal gets the venv by a block of its own, which runs here
    assert any(b.runs and "source .venv/bin/activate" in b.text for b in README_BLOCKS)


def test_the_readme_runs_in_order_against_make_serve(make_serve: MakeServe, tmp_path: Path) -> None:
    walk = [b for b in README_BLOCKS if b.runs]
    assert len(walk) >= 8, [b.name for b in walk]  # the runner found them
    script = session(walk, make_serve.port, free_port(), tmp_path)
    log = tmp_path / "session.log"  # a file, not a pipe: a server left running holds a pipe
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", script],
            cwd=REPO, env=reader_env(tmp_path), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            rc = process.wait(SESSION_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            stop(process)  # the Hugging Face server it left in the background
    output = log.read_text(errors="replace")
    ran = re.findall(rf"^{BEGIN} (\S+) \d+$", output, re.M)
    at = ran[-2] if len(ran) > 1 and ran[-1] == "end" else (ran[-1] if ran else "the start")
    assert rc == 0, (
        f"the walk-through stopped at {at} ({'timed out' if rc is None else f'exit {rc}'}); "
        f"took {timings(output)}:\n{output[-4000:]}"
    )
    assert ran == [b.name for b in walk] + ["end"]
    # what the blocks say they make: the Hugging Face picture and scores, the TCAV rows
    assert (tmp_path / "hf" / "overlay.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "hf" / "saliency.npz").is_file()
    tcav = r"^bright-top-left features\.3 \S+ \S+ (for|against|not significant)$"
    assert re.search(tcav, output, re.M), output[-4000:]
    print(f"README blocks: {timings(output)}")  # shown with -s or -rA: where the time goes
