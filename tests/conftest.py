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
# a fixture it is the first to use, is marked ``processes`` (those of a fixture that starts
# processes are: tests/service/conftest.py). An unmarked test that starts one fails, naming
# what it started: test-fast stays process-free.

#: the unmarked test running now (None: a marked one, or none)
_unmarked: str | None = None
#: what each unmarked test started
_started: dict[str, list[str]] = {}


def _noting(what: str, start: Any) -> Any:
    @functools.wraps(start)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if _unmarked is not None:
            _started.setdefault(_unmarked, []).append(f"{what} {_argv(args, kwargs)}")
        return start(*args, **kwargs)

    return wrapped


def _argv(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    argv = kwargs.get("args", args[1] if len(args) > 1 else args[0] if args else "")
    return str(argv if isinstance(argv, str) else " ".join(map(str, argv)))[:120]


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen.__init__ = _noting("subprocess", subprocess.Popen.__init__)  # type: ignore[method-assign]
    BaseProcess.start = _noting("multiprocessing", BaseProcess.start)  # type: ignore[method-assign]


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
