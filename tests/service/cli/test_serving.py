"""``attrserve serve`` with its port taken fails at once, naming the address, before a worker
starts (uvicorn binds only after the lifespan has loaded every model)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import service.app
from service.cli.serving import check_address, serve


@pytest.fixture
def held() -> Iterator[int]:
    """A port another process would hold: a listening socket on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_taken_port_fails_before_the_app_is_built(
    held: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def never(*a: object, **kw: object) -> None:
        raise AssertionError("the app (and its workers) was built")

    monkeypatch.setattr(service.app, "create_app", never)
    with pytest.raises(SystemExit) as exit_:
        serve(argparse.Namespace(host="127.0.0.1", port=held, models=None))
    assert exit_.value.code == 3
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{held}: Address already in use" in err
    assert "--port" in err


def test_a_free_port_passes_and_is_let_go() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    check_address("127.0.0.1", port)
    with socket.socket() as again:  # the probe holds nothing: uvicorn binds it next
        again.bind(("127.0.0.1", port))


def test_a_host_that_does_not_resolve_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        check_address("no-such-host.invalid", 8000)
    assert "cannot listen on no-such-host.invalid:8000" in capsys.readouterr().err


@pytest.mark.processes
def test_the_command_exits_within_seconds_with_one_line(held: int, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    env["ATTRSERVE_DATA_DIR"] = str(tmp_path)  # were it to start, never in the working tree
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "service.cli.main", "serve", "--port", str(held)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    took = time.monotonic() - start
    assert done.returncode == 3, done.stderr
    # one line, nothing of uvicorn's or a worker's start (loading the built-ins takes longer)
    assert done.stderr.splitlines() == [
        f"attrserve serve: error: cannot listen on 127.0.0.1:{held}: Address already in use "
        "(another process listens there: stop it, or choose --port / ATTRSERVE_PORT)"
    ]
    assert done.stdout == ""
    assert took < 5, f"{took:.1f} s"
