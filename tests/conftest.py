from __future__ import annotations

import os
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
