"""Dockerfile and docker-compose.yml agree with the CLI (no Docker engine runs here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from service.cli import main

REPO = Path(__file__).resolve().parents[2]


def _compose_service() -> str:
    text = (REPO / "docker-compose.yml").read_text()
    assert re.search(r"^services:\n  attrserve:", text, re.M)
    return text


def test_compose_command_and_port_agree_with_cli() -> None:
    text = _compose_service()
    cmd = re.search(r"^\s+command: (\[.*\])$", text, re.M)
    assert cmd is not None
    argv = [a.strip().strip('"') for a in cmd.group(1).strip("[]").split(",")]
    assert argv[0] == "attrserve" and argv[1] == "serve"
    port = argv[argv.index("--port") + 1]
    assert f'- "{port}:{port}"' in text
    assert f"127.0.0.1:{port}/v1/health/ready" in text
    assert re.search(r"^\s+- models:/models$", text, re.M)
    import argparse

    parsed: dict[str, argparse.Namespace] = {}

    def fake_serve(args: argparse.Namespace) -> None:
        parsed["args"] = args

    import service.cli as cli

    real = cli.serve
    cli.serve = fake_serve  # type: ignore[assignment]
    try:
        main(argv[1:])
    finally:
        cli.serve = real  # type: ignore[assignment]
    assert parsed["args"].port == int(port) and parsed["args"].host == "0.0.0.0"


def test_dockerfile() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "ARG BASE=python:3.11-slim" in text  # CPU by default, CUDA base by build argument
    assert re.search(r"^USER attrserve$", text, re.M)  # non-root
    assert "HEALTHCHECK" in text and "/v1/health/ready" in text
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd is not None
    argv = shlex.split(cmd.group(1).strip("[]").replace(",", " "))
    assert argv[:2] == ["attrserve", "serve"] and "8000" in argv and "EXPOSE 8000" in text
