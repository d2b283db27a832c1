"""``python -m tests.hf_dirs``: the README's walk-through command takes arguments as a command
does (it once wrote a directory named ``--help``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes  # a fresh interpreter

REPO = Path(__file__).resolve().parents[1]


def test_help_prints_usage_and_builds_nothing(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.hf_dirs", "--help"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: python -m tests.hf_dirs")
    assert list(tmp_path.iterdir()) == []
