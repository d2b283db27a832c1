"""``make serve`` installs once: again only when pyproject.toml or constraints.txt change (a
stamp in the venv, as the dev install's), so a second start plans no ``pip install``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed"),
    pytest.mark.processes,  # make
]


def make(*args: str) -> str:
    """``make ARGS`` in the checkout (its Makefile, pyproject.toml and constraints.txt)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout


def test_a_second_make_serve_plans_no_install(tmp_path: Path) -> None:
    # a venv of its own whose pip only says what it was asked (the checkout's .venv is untouched)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    fake = (f"VENV={venv}", "PIP=echo pip")
    first = make("-n", "serve", *fake)
    # the README's Hugging Face extra, and scikit-image's superpixels (the regions extra)
    assert "pip install" in first and "-e '.[hf,regions]'" in first
    make("install", *fake)  # the install, once
    second = make("-n", "serve", *fake)
    assert "pip" not in second
    assert second.strip() == f"{venv}/bin/attrserve serve --host 127.0.0.1 --port 8000"
    assert "--port 9000" in make("-n", "serve", "PORT=9000", *fake)


def test_the_dev_install_counts_as_the_runtime_one(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    fake = (f"VENV={venv}", "PIP=echo pip")
    make("install-dev", *fake)
    assert "pip" not in make("-n", "serve", *fake)
