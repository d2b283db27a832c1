"""Every shell and Python code block of the README and docs/ runs, as written, against a live
server: the docs stay true.

A block runs as a reader would paste it, with two substitutions only: the README's demo server
(``localhost:8000``) is the session's main server (tests/service/conftest.py: the built-in
models and the Hugging Face ones), and ``curl`` fails on an HTTP error (``--fail-with-body``),
so a 4xx answer fails the test instead of printing a problem document. A block that starts its
own server (the README's Hugging Face walk-through) gets a free port instead of its own and a
scratch directory instead of ``/tmp``, and its processes are stopped after it.

A block that cannot run here says so where it stands, on the line before it:
``<!-- snippet: skip: <why> -->`` (installs, docker, Kubernetes, a server that holds the
terminal). ``<!-- snippet: own-server -->`` marks a block that starts a server, and
``<!-- snippet: http-error -->`` one that shows an error answer (it must get one). Every other
``sh``, ``bash``, ``console`` or ``python`` block is run; ``json``, ``toml`` and ``text`` blocks
are what the reader sees, not commands."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.conftest import Server

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN = {"sh", "bash", "console", "python"}
SHOWN = {"json", "toml", "text", "yaml", "http", ""}
MARK = re.compile(r"<!--\s*snippet:\s*(skip|own-server|http-error)\s*(?::\s*(.*?))?\s*-->")
#: the README's demo server, as its blocks name it
DEMO = re.compile(r"(localhost|127\.0\.0\.1):8000")
#: curl that fails on an HTTP error, as a reader would notice one (unless the block asks for
#: --fail itself: a readiness loop)
PREAMBLE = """curl() {
  case " $* " in
    *" -f"* | *" -sf"* | *" --fail"*) command curl --max-time 180 "$@" ;;
    *) command curl --fail-with-body --max-time 180 "$@" ;;
  esac
}
"""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    text: str
    mark: str | None  # None, "skip", "own-server" or "http-error" (it shows a 4xx)
    why: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, with the marker on the line before each."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.search(before)
        found.append(
            Block(
                page,
                i + 1,
                fence.group(1),
                "\n".join(lines[i + 1 : end]) + "\n",
                mark.group(1) if mark else None,
                (mark.group(2) or "") if mark else "",
            )
        )
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL if b.lang in RUN]


def test_every_block_is_run_shown_or_skipped_with_a_reason() -> None:
    unknown = [b.name for b in ALL if b.lang not in RUN | SHOWN]
    assert unknown == [], f"blocks of a language the runner does not know: {unknown}"
    silent = [b.name for b in RUNNABLE if b.mark == "skip" and not b.why]
    assert silent == [], f"skipped without saying why: {silent}"
    assert len([b for b in RUNNABLE if b.mark != "skip"]) >= 20  # the runner found them


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


def _commands(block: Block) -> str:
    """A console block's commands (its ``$ `` lines); a shell block as it is."""
    if block.lang != "console":
        return block.text
    return "\n".join(ln[2:] for ln in block.text.splitlines() if ln.startswith("$ ")) + "\n"


def run_block(block: Block, server: Server, tmp: Path) -> subprocess.CompletedProcess[str]:
    url = server.url.removeprefix("http://")
    text = DEMO.sub(url, _commands(block))
    env = _env(tmp)
    if block.mark == "own-server":  # its own port and scratch directory, stopped after
        port = str(_free_port())
        text = text.replace("8001", port).replace("/tmp/", f"{tmp}/")
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


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.name for b in RUNNABLE])
def test_block_runs(block: Block, server: Server, tmp_path: Path) -> None:
    if block.mark == "skip":
        pytest.skip(block.why)
    if block.lang != "python" and shutil.which("curl") is None and "curl" in block.text:
        pytest.fail("curl is missing (the docs use it; apt-get install curl)")
    done = run_block(block, server, tmp_path)
    if block.mark == "http-error":  # the block shows an error: curl's exit for an HTTP error
        assert done.returncode == 22, f"{block.name} did not fail as shown:\n{done.stdout[-3000:]}"
        assert "problem" in done.stdout or '"status"' in done.stdout, done.stdout[-3000:]
        return
    assert done.returncode == 0, f"{block.name} failed ({done.returncode}):\n{done.stdout[-3000:]}"
