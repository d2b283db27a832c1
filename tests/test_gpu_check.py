"""benchmarks.gpu_check: the refusal without CUDA, and its checks run on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_check import Row

REPO = Path(__file__).resolve().parents[1]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="refuses only without CUDA")


@no_cuda
@pytest.mark.processes  # a fresh interpreter
def test_without_cuda_it_refuses_in_one_line_before_importing_torch() -> None:
    code = (
        "import sys; from benchmarks.gpu_check import main; rc = main([]); "
        "print('torch' in sys.modules); raise SystemExit(rc)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0
    assert p.stdout.strip().splitlines() == [gpu_check.NO_CUDA, "False"]
    assert p.stdout.startswith("no CUDA device: gpu-check needs a GPU")


@no_cuda
@pytest.mark.processes  # a fresh interpreter
def test_the_module_entry_refuses_too() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--skip-bench"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout.strip(), p.stderr) == (0, gpu_check.NO_CUDA, "")


@no_cuda
@pytest.mark.processes  # a fresh interpreter
def test_make_gpu_check_installs_nothing_without_a_driver(tmp_path: Path) -> None:
    """CONTRACT 8.1: without CUDA, ``make gpu-check`` prints "no CUDA device" and exits 0
    without running anything: not even the install a fresh clone would need."""
    if gpu_check._driver_present():
        pytest.skip("an NVIDIA driver is here")
    venv = tmp_path / "venv"
    p = subprocess.run(
        ["make", "--no-print-directory", "gpu-check", f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (p.returncode, p.stdout.strip()) == (0, gpu_check.NO_CUDA), p.stderr
    assert not venv.exists()


@no_cuda
def test_a_driver_without_a_cuda_torch_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gpu_check, "_driver_present", lambda: True)
    assert gpu_check.main([]) == 0
    assert capsys.readouterr().out.strip() == gpu_check.NO_CUDA


def test_parity_gives_one_passing_row_per_family_on_the_cpu() -> None:
    rows = gpu_check.check_parity("cpu", cases=("mlp",))
    assert [r.check for r in rows] == [
        "parity gradient",
        "parity perturbation",
        "parity layer",
        "parity neuron",
    ]
    assert all(r.result == "PASS" for r in rows), [r.figures for r in rows]
    assert all("worst" in r.figures for r in rows)
    assert "seeded repeat only: gradient_shap" in rows[0].figures
    names = {m["name"] for r in rows for m in r.data["methods"]}
    assert "lime" in names and "layer_integrated_gradients" in names


def test_parity_names_the_failing_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    from methods import verify

    monkeypatch.setitem(verify.TOLERANCE, torch.float32, 0.0)
    gradient, neuron = gpu_check.check_parity(
        "cpu", cases=("mlp",), only={"integrated_gradients", "neuron_gradient", "saliency"}
    )
    assert gradient.result == "FAIL"
    assert "FAILED: integrated_gradients (mlp: " in gradient.figures
    assert "; saliency (mlp: " in gradient.figures
    assert neuron.result == "PASS", neuron.figures  # exact in float32 here: 0 <= 0


def test_parity_skips_a_method_no_model_fits_and_says_why() -> None:
    [row] = gpu_check.check_parity("cpu", cases=("cnn",), only={"shapley_values"})
    assert row.result == "PASS"
    assert "skipped: shapley_values (no conformance model fits)" in row.figures


def test_fidelity_reports_each_method_in_each_precision() -> None:
    rows = gpu_check.check_fidelity("cpu", precisions=("bfloat16",), n_steps=8, n_images=2)
    assert [r.check for r in rows] == [
        "fidelity integrated_gradients",
        "fidelity layer_integrated_gradients",
        "fidelity saliency",
        "fidelity occlusion",
        "fidelity generation feature_ablation",
        "fidelity generation layer_integrated_gradients",
    ]
    assert all(r.result == "PASS" for r in rows), [r.figures for r in rows]
    for r in rows:
        assert r.figures.startswith("bfloat16: L2 ")
        assert r.data["bfloat16"]["checked"] is True
    assert "delta" in rows[0].figures  # integrated gradients has a convergence delta


def test_oom_retry_is_skipped_on_the_cpu() -> None:
    [row] = gpu_check.check_oom("cpu")
    assert (row.result, row.figures) == ("SKIP", "needs CUDA (a capped device allocator)")


def test_compile_matches_eager() -> None:
    [row] = gpu_check.check_compile("cpu", backend="eager", n_steps=4, batch=2, timing_s=0.2)
    assert row.result == "PASS", row.figures
    assert row.data["rel_diff"] <= 1e-6
    assert "compile" in row.figures and "x)" in row.figures


def test_incremental_occlusion_equals_full_forwards_and_is_timed() -> None:
    [row] = gpu_check.check_incremental("cpu", images=1, size=64, tiny=True)
    assert row.result == "PASS", row.figures
    assert row.data["strategy"] == "incremental" and row.data["rel_diff"] <= 1e-5
    assert "on by default here: True" in row.figures


def test_channels_last_inputs_answer_as_given_and_are_timed() -> None:
    from methods.engine import layout

    before = layout.DEVICES
    [row] = gpu_check.check_channels_last("cpu", images=1, size=32, n_steps=4, tiny=True)
    assert row.result == "PASS", row.figures
    assert row.data["rel_diff"] <= 1e-5 and row.data["channels_last_s"] > 0
    assert "on by default here: True" in row.figures and before == layout.DEVICES


def test_a_check_that_raises_becomes_one_fail_row() -> None:
    def broken() -> list[Row]:
        raise torch.OutOfMemoryError("CUDA out of memory.\nTried to allocate 2.00 GiB")

    [row] = gpu_check.guarded("oom retry", broken)
    assert (row.check, row.result) == ("oom retry", "FAIL")
    assert row.figures == "OutOfMemoryError: CUDA out of memory."


def _fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    (tmp_path / "fake_bench_gc.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "fake_bench_gc"


@pytest.mark.processes  # the benchmark's interpreter
def test_the_benchmark_runs_with_its_table_and_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _fake_bench(
        tmp_path,
        monkeypatch,
        """
        import sys
        assert sys.argv[1:] == ["--quick", "--device", "cuda"], sys.argv
        print("| case | ms |")
        print("|---|---|")
        print("| ig | 1.0 |")
        """,
    )
    row, out = gpu_check.run_bench("cuda", 60, module)
    assert (row.result, row.figures) == ("PASS", "exit 0; 3 table lines (below)")
    assert "| ig | 1.0 |" in out


@pytest.mark.processes  # the benchmark's interpreter
def test_a_failing_slow_or_missing_benchmark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = _fake_bench(tmp_path, monkeypatch, "import sys, time\nsys.exit('broken')\n")
    row, _ = gpu_check.run_bench("cuda", 60, module)
    assert (row.result, row.figures) == ("FAIL", "exit 1: broken")
    (tmp_path / "fake_bench_gc.py").write_text("import time\nprint('started', flush=True)\n"
                                               "time.sleep(30)\n")  # fmt: skip
    row, out = gpu_check.run_bench("cuda", 1, module)
    assert (row.result, row.figures, out) == ("FAIL", "timed out after 1 s", "started\n")
    row, _ = gpu_check.run_bench("cuda", 60, "benchmarks.no_such_bench")
    assert (row.result, row.figures) == ("SKIP", "benchmarks.no_such_bench not present")


def test_main_prints_one_table_writes_it_and_fails_when_a_check_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken() -> list[Row]:
        raise ValueError("bad | thing")

    monkeypatch.setattr(
        gpu_check,
        "checks",
        lambda device: [
            ("ok", lambda: [Row("ok", "PASS", "fine")]),
            ("broken", broken),
            ("skipped", lambda: [Row("skipped", "SKIP", "needs CUDA")]),
        ],
    )
    assert gpu_check.main(["--device", "cpu", "--skip-bench", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("|")]
    assert lines[0] == "| check | result | figures | seconds |"
    assert lines[3].startswith("| broken | FAIL | ValueError: bad \\| thing | ")
    assert len(lines) == 5 and out.rstrip().endswith(lines[-1])
    assert "1 pass, 1 fail, 1 skip" in out
    md = (tmp_path / "gpu_check.md").read_text()
    assert "\n".join(lines) in md
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["result"] for r in doc["rows"]] == ["PASS", "FAIL", "SKIP"]
    assert doc["environment"]["device"] == "cpu"

    monkeypatch.setattr(
        gpu_check, "checks", lambda device: [("ok", lambda: [Row("ok", "PASS", "")])]
    )
    assert gpu_check.main(["--device", "cpu", "--skip-bench"]) == 0
