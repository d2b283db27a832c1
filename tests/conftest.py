from __future__ import annotations

import functools
import os
import subprocess
from multiprocessing.process import BaseProcess
from typing import Any

import pytest
import torch

# no test downloads (this machine has no network): Hugging Face's hub reads this once, at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _deterministic() -> None:
    torch.manual_seed(0)


def _rounding_otherwise(laid_out: Any) -> Any:
    """``laid_out`` (image batches channels-last) with each element of those batches moved by
    at most one unit in the last place, in a fixed pattern: a CPU whose kernels round
    otherwise than this one's. Values equal as given (a constant baseline, a flat region) are
    then a rounding apart, on every CPU."""

    def fed(inputs: tuple[object, ...]) -> tuple[object, ...]:
        out = []
        for x in laid_out(inputs):
            if isinstance(x, torch.Tensor) and x.dim() == 4 and x.is_floating_point():
                ulps = (torch.arange(x.numel(), device=x.device) % 3 - 1).view(x.shape)
                x = x * (1 + torch.finfo(x.dtype).eps * ulps.to(x.dtype))
            out.append(x)
        return tuple(out)

    return fed


@pytest.fixture(params=["channels_last", "as_given"])
def both_layouts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Runs a test twice whatever this CPU would pick (CONTRACT 9.1): with image batches fed
    channels-last wherever the engine feeds them, rounded otherwise than here
    (``_rounding_otherwise``: the ties another CPU's kernels break differently show on this
    one), and with the layout off (``layout.DEVICES`` emptied)."""
    from methods.engine import inputs as engine_inputs
    from methods.engine import layout

    if request.param == "channels_last":
        monkeypatch.setattr(layout, "DEVICES", ("cpu",))
        monkeypatch.setattr(
            engine_inputs,
            "images_channels_last",
            _rounding_otherwise(engine_inputs.images_channels_last),
        )
    else:
        monkeypatch.setattr(layout, "DEVICES", ())
    return str(request.param)


# -- the ``processes`` marker (make test-fast: -m "not processes") -------------------------------
# A test that starts a process (a server, worker processes, a tool, a browser), in its body or in
# a fixture it is the first to use, is marked ``processes`` (the tests of the fixtures in
# PROCESS_FIXTURES are). An unmarked test that starts one fails, naming what it started:
# test-fast stays process-free.

#: fixtures that start processes: their tests are marked ``processes``
PROCESS_FIXTURES = frozenset(
    {
        "tight_server",  # service/conftest.py: a worker process to kill
        "browser",  # service/explorer/test_explorer.py: Chromium
        "traced",  # service/http/test_tracing.py: a server with OTEL_* variables of its own
        "hf_server",  # service/kinds/test_hf_classifiers.py: a server without HF_HUB_OFFLINE
        "site",  # test_docs.py: mkdocs build
        "compiled",  # service/kinds/test_prepare.py: torch.compile runs a C++ compiler
    }
)
#: the unmarked test running now (None: a marked one, or none)
_unmarked: str | None = None
#: what each unmarked test started
_started: dict[str, list[str]] = {}


def _noting(what: str, start: Any, name: Any) -> Any:
    @functools.wraps(start)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _unmarked is not None:
            _started.setdefault(_unmarked, []).append(f"{what} {name(self, args, kwargs)}"[:160])
        return start(self, *args, **kwargs)

    return wrapped


def _command(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    argv = kwargs.get("args", args[0] if args else "")
    return str(argv) if isinstance(argv, str | bytes) else " ".join(map(str, argv))


def pytest_configure(config: pytest.Config) -> None:
    popen, start = subprocess.Popen.__init__, BaseProcess.start
    subprocess.Popen.__init__ = _noting("subprocess", popen, _command)  # type: ignore[method-assign]
    BaseProcess.start = _noting("process", start, lambda p, *_: p.name)  # type: ignore[method-assign]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _unmarked
    _unmarked = None if item.get_closest_marker("processes") else item.nodeid
    try:
        return (yield)
    finally:
        _unmarked = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    started = _started.pop(item.nodeid, None) if call.when == "teardown" else None
    if started:
        report.outcome = "failed"
        report.longrepr = (
            "started a process but is not marked processes (pytest.mark.processes):\n  "
            + "\n  ".join(started)
        )
    return report
