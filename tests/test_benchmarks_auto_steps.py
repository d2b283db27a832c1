"""``benchmarks.auto_steps`` runs end to end (on tiny configs of the same architectures) and
its table says what n_steps="auto" paid and how far it landed from 50-step Gauss-Legendre."""

from __future__ import annotations

import pytest

from benchmarks import auto_steps


def test_the_table_has_every_model_rule_and_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    assert auto_steps.main(["--tiny"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == 3 * (1 + 2 * 2)  # the fixed 50 points, then two rules at two tolerances
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        steps, evaluations = int(cells[3]), int(cells[4])
        if cells[1] == "gausslegendre (fixed)":
            assert steps == evaluations == 50 and float(cells[9]) == 1.0
            continue
        if cells[1] == "clenshaw_curtis":  # nested: it pays only the points it stops at
            assert evaluations == steps
        else:
            assert evaluations >= steps
        assert float(cells[6]) < 0.05 and cells[7] in ("delta", "stable")
        assert float(cells[8]) > 0 and float(cells[9]) > 0
