"""benchmarks.real: every case builds its rows, one case runs end to end on tiny configs, runs
over the time limit are skipped and say so, and --device cuda without CUDA is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import real

pytest.importorskip("transformers")
pytest.importorskip("captum")

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only without CUDA")

ROWS = [
    "bert/layer_ig",
    "bert/feature_ablation",
    "distilbert/layer_ig",
    "gpt2/feature_ablation",
    "gpt2/layer_ig",
    "resnet/integrated_gradients",
    "resnet/layer_gradcam",
    "resnet/occlusion",
    "vit/integrated_gradients",
    "vit/saliency",
    "vit/occlusion",
    "qa/layer_ig",
    "segformer/integrated_gradients",
    "segformer/feature_ablation",
    "detr/feature_ablation",
    "clip/integrated_gradients",
]


def table_of(out: str) -> tuple[list[str], list[list[str]]]:
    """The markdown table's header cells and body rows."""
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    return cells[0], cells[2:]


def test_every_case_builds_its_rows() -> None:
    s = real.sizes(quick=True, device=CPU, tiny=True)
    rows = [row for build in real.CASES.values() for row in build(s, CPU)]
    assert [r.key for r in rows] == ROWS
    assert all(r.rows >= r.unit >= 1 for r in rows)


@pytest.mark.parametrize("case", ["qa", "segformer", "detr", "clip"])
def test_each_task_case_answers_as_captums_wrapper(case: str) -> None:
    """The tasks' rows: ours through the serving wrappers equals Captum on its tutorials'
    hand-written wrappers (tiny configs)."""
    s = real.sizes(quick=True, device=CPU, tiny=True)
    for row in real.CASES[case](s, CPU):
        ours = real.attributions(row.ours("float32"))
        want = row.captum()
        torch.testing.assert_close(ours, want, rtol=1e-4, atol=1e-5)


def test_one_case_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert real.main(["--tiny", "--only", "resnet", "--json", str(out)]) == 0
    header, body = table_of(capsys.readouterr().out)
    assert header == real.headers(["bfloat16"], CPU)
    for column in ("Captum f32 s", "ours f32 s", "ours/Captum", "ours bfloat16 s",
                   "bfloat16/Captum", "floor f32 s", "ours/floor", "ours f32 RSS Δ MiB",
                   "bfloat16 rel L2", "bfloat16 top-10", "ours vs Captum rel L2"):  # fmt: skip
        assert column in header
    assert [r[1] for r in body] == ["IG n=4", "Grad-CAM (last stage)",
                                    "occlusion 16x16 stride 16 (4 windows)"]  # fmt: skip
    data = json.loads(out.read_text())
    assert data["meta"]["device"] == "cpu"
    for row in data["rows"]:
        assert row["captum_s"] > 0 and row["floor_s"] > 0 and not row["skipped"]
        assert set(row["ours_s"]) == {"float32", "bfloat16"}
        rel, agree, k = row["fidelity"]["bfloat16"]
        assert rel < 0.2 and 0 <= agree <= 1 and k >= 1
        assert row["vs_captum_rel_l2"] < 1e-4  # the same numbers as Captum, in float32


def test_runs_over_the_limit_are_skipped_and_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert real.main(["--tiny", "--only", "vit/saliency", "--max-run-s", "0"]) == 0
    header, (row,) = table_of(capsys.readouterr().out)
    cell = dict(zip(header, row, strict=True))
    assert cell["Captum f32 s"].startswith("skipped (--max-run-s 0): est.")
    assert cell["ours f32 s"].startswith("skipped")
    assert cell["floor f32 s"].endswith("(est.)")


def test_captum_out_of_memory_runs_both_sides_at_one_fixed_batch_size() -> None:
    seen: list[tuple[str, int]] = []

    def unset() -> torch.Tensor:
        raise torch.OutOfMemoryError("out of memory")

    def fixed(batch: int) -> real.Runs:
        def ours(precision: str) -> torch.Tensor:
            seen.append(("ours " + precision, batch))
            return torch.arange(4.0)[None]

        def captum() -> torch.Tensor:
            seen.append(("captum", batch))
            if batch > 2:
                raise torch.OutOfMemoryError("out of memory")
            return torch.arange(4.0)[None]

        return ours, captum

    row = real.Row(
        "x/ig", "case", "IG", lambda p: None, unset, lambda k: lambda: None, rows=8, unit=1,
        fixed=fixed,
    )  # fmt: skip
    limits = real.Limits(run_s=60, deadline=None, why="quick")
    m = real.measure(row, CPU, ["bfloat16"], {"bfloat16": 1.0}, limits, repeat_under=0)
    assert "Captum ran out of memory with internal_batch_size unset: both at 2" in m.notes
    assert {b for _, b in seen} == {4, 2} and ("ours float32", 2) in seen
    assert m.vs_captum_rel_l2 == 0 and m.fidelity["bfloat16"][0] == 0


@no_cuda
@pytest.mark.processes  # a fresh interpreter
def test_cuda_without_a_gpu_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert real.main(["--device", "cuda", "--quick"]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", real.NO_CUDA + "\n")
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.real", "--device", "cuda"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (p.returncode, p.stdout, p.stderr.strip()) == (2, "", real.NO_CUDA)


def test_peak_memory_is_the_runs_own() -> None:
    """The CPU peak (Linux's reset peak RSS, else a sampling thread) sees a run's transient
    allocation, freed before the run ends, and not what was held before it."""
    import torch

    held = torch.ones(64 << 18)  # 64 MiB held throughout
    with real.peak_mib(torch.device("cpu")) as mem:
        big = torch.ones(128 << 18)  # 128 MiB, freed inside the run
        big.add_(1)
        del big
    assert mem[0] is not None and 100 < mem[0] < 200, mem[0]
    del held
