"""``python -m benchmarks.regions --quick`` runs (a tiny ResNet at 64 px), and its tables
report that the region methods agree with PAIR saliency's before they are timed."""

from __future__ import annotations

import pytest

from benchmarks import regions

pytest.importorskip("saliency.core")


def test_the_quick_run_fills_every_table() -> None:
    lines = regions.main(["--quick"])
    text = "\n".join(lines)
    for name in regions.SPECS:
        assert f"| {name} |" in text
    # float32 on both sides: a near tie may break the other way on another CPU
    alike = float(text.split("regions ranked alike on ")[1].split("%")[0])
    assert alike >= 90
    rel = float(text.split("relative L2 difference ")[1].split()[0])
    assert rel < 1e-3  # blur_ig and BlurIG agree (float32)
