"""``attrserve attribute``: files in, the HTTP route's numbers and errors out, resumable."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import methods
import model_registry
from service.attributions.serving import build_work
from service.cli import main as cli
from service.cli import offline
from service.cli.offline import command  # where the command looks up attribute_batch
from service.core.errors import ServiceError
from service.core.settings import Settings
from service.kinds import run as run_work
from service.wire.attributions import AttributionRequest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

REPO = Path(__file__).resolve().parents[1]
SPECS = {s.id: s for s in model_registry.load_specs(None)}
X = np.random.default_rng(0).normal(size=(10, 8)).astype(np.float32)
TEXTS = [
    "a great film",
    "an awful plot",
    "the plot was great and the acting wonderful",
    "dull",
    "a wonderful and great film with an awful ending",
]
ATTRIBUTE_BATCH = offline.attribute_batch
IG = ["--method", "integrated_gradients", "--params", '{"n_steps": 16}']


@pytest.fixture(scope="module")
def models() -> dict[str, model_registry.LoadedModel]:
    return {i: model_registry.load(SPECS[i]) for i in ("tabular-mlp", "text-classifier")}


def serve(lm: model_registry.LoadedModel, **body: Any) -> Any:
    """What the HTTP route computes for one request holding every example."""
    work = build_work(Settings(), lm.spec, AttributionRequest(**body), math.inf)
    return run_work(lm, work)


def attribute(tmp: Path, *args: str, model: str = "tabular-mlp") -> int:
    return cli.main(["attribute", "--model", model, *args])


def npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def write_inputs(path: Path, x: np.ndarray = X, targets: list[Any] | None = None) -> Path:
    """``x`` in the format of ``path``'s suffix (targets too, where the format has them)."""
    suffix = path.suffix
    if suffix == ".npy":
        np.save(path, x)
    elif suffix == ".npz":
        extra = {} if targets is None else {"target": np.asarray(targets)}
        np.savez(path, x=x, **extra)
    elif suffix == ".pt":
        torch.save((torch.from_numpy(x),), path)
    elif suffix == ".parquet":
        cols: dict[str, Any] = {"x": [r.tolist() for r in x]}
        if targets is not None:
            cols["target"] = targets
        pq.write_table(pa.table(cols), path)
    else:
        with path.open("w") as f:
            for i, row in enumerate(x):
                line: dict[str, Any] = {"inputs": row.tolist()}
                if targets is not None and targets[i] is not None:
                    line["target"] = targets[i]
                f.write(json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize("fmt", [".npy", ".npz", ".pt", ".parquet", ".jsonl"])
def test_each_input_format_gives_the_http_routes_numbers(
    tmp_path: Path, fmt: str, models: dict[str, Any]
) -> None:
    src = write_inputs(tmp_path / f"x{fmt}")
    out = tmp_path / "attr.npz"
    rc = attribute(tmp_path, *IG, "--inputs", str(src), "--target", "high", "--output", str(out))
    assert rc == 0
    got = npz(out)
    want = serve(
        models["tabular-mlp"],
        method="integrated_gradients",
        inputs=X.tolist(),
        target="high",
        params={"n_steps": 16},
    )
    np.testing.assert_allclose(got["attributions"], want.attributions[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["outputs"], want.outputs, rtol=1e-6)
    assert got["target"].tolist() == [2] * len(X)
    engine = methods.attribute(
        models["tabular-mlp"].model,
        torch.from_numpy(X),
        "integrated_gradients",
        target=2,
        n_steps=16,
    )
    np.testing.assert_allclose(
        got["attributions"], engine.attributions.numpy(), rtol=1e-5, atol=1e-6
    )
    assert not out.with_name("attr.npz.partial").exists()


def test_parquet_output_holds_one_row_per_example(tmp_path: Path) -> None:
    src = write_inputs(tmp_path / "x.npy")
    args = [*IG, "--inputs", str(src), "--target", "predicted", "--convergence-delta"]
    assert attribute(tmp_path, *args, "--output", str(tmp_path / "a.npz")) == 0
    assert attribute(tmp_path, *args, "--output", str(tmp_path / "a.parquet")) == 0
    table = pq.read_table(tmp_path / "a.parquet")
    assert table.num_rows == len(X)
    assert table.column_names == ["attributions", "outputs", "convergence_delta", "target"]
    ref = npz(tmp_path / "a.npz")
    for name in table.column_names:
        np.testing.assert_array_equal(np.asarray(table.column(name).to_pylist()), ref[name])


def test_chunks_give_what_one_chunk_gives(tmp_path: Path) -> None:
    src = write_inputs(tmp_path / "x.npz")
    base = ["--method", "gradient_shap", "--seed", "3", "--inputs", str(src), "--target", "1"]
    base += ["--convergence-delta", "--baselines", "0"]
    for name, size in (("one", "64"), ("many", "3")):  # 10 examples: chunks of 3, 3, 3, 1
        assert (
            attribute(
                tmp_path,
                *IG[:2],
                "--inputs",
                str(src),
                "--target",
                "predicted",
                "--batch-size",
                size,
                "--output",
                str(tmp_path / f"{name}.npz"),
            )
            == 0
        )
    one, many = npz(tmp_path / "one.npz"), npz(tmp_path / "many.npz")
    assert one.keys() == many.keys()
    for k in one:
        np.testing.assert_allclose(many[k], one[k], rtol=1e-6, atol=1e-7)
    # per-sample deltas (k rows per example) cut and joined example-major
    out = tmp_path / "shap.parquet"
    assert attribute(tmp_path, *base, "--batch-size", "4", "--output", str(out)) == 0
    table = pq.read_table(out)
    assert np.asarray(table.column("convergence_delta").to_pylist()).shape == (10, 5)


def test_texts_from_jsonl_and_parquet(tmp_path: Path, models: dict[str, Any]) -> None:
    lines = tmp_path / "t.jsonl"
    lines.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in TEXTS))
    pq.write_table(pa.table({"text": TEXTS}), tmp_path / "t.parquet")
    lm = models["text-classifier"]
    for method in ("integrated_gradients", "feature_ablation"):
        want = serve(lm, method=method, inputs=TEXTS, target="positive")
        args = ["--method", method, "--target", "positive", "--batch-size", "2"]
        out_npz, out_pq = tmp_path / f"{method}.npz", tmp_path / f"{method}.parquet"
        assert (
            attribute(
                tmp_path,
                *args,
                "--inputs",
                str(lines),
                "--output",
                str(out_npz),
                model="text-classifier",
            )
            == 0
        )
        assert (
            attribute(
                tmp_path,
                *args,
                "--inputs",
                str(tmp_path / "t.parquet"),
                "--output",
                str(out_pq),
                model="text-classifier",
            )
            == 0
        )
        got, rows = npz(out_npz), pq.read_table(out_pq).to_pylist()
        assert [[t for t in row if t] for row in got["tokens"].tolist()] == want.tokens
        for i, tokens in enumerate(want.tokens):
            scores = want.attributions[0][i, : len(tokens)]
            np.testing.assert_allclose(got["attributions"][i, : len(tokens)], scores, rtol=1e-5)
            assert not got["attributions"][i, len(tokens) :].any()  # padding: zeros
            assert rows[i]["tokens"] == tokens
            np.testing.assert_allclose(rows[i]["attributions"], scores, rtol=1e-5)
        np.testing.assert_allclose(got["outputs"], want.outputs, rtol=1e-5)


def test_targets_per_example_from_the_file_and_the_option(
    tmp_path: Path, models: dict[str, Any]
) -> None:
    lm = models["tabular-mlp"]
    mixed = [None, "low", 2, None, 0, 1, None, None, "mid", 0]
    src = write_inputs(tmp_path / "x.jsonl", targets=mixed)
    out = tmp_path / "a.npz"
    assert (
        attribute(
            tmp_path,
            *IG,
            "--inputs",
            str(src),
            "--target",
            "1",
            "--batch-size",
            "4",
            "--output",
            str(out),
        )
        == 0
    )
    rows = [1 if t is None else t for t in mixed]
    want = serve(
        lm, method="integrated_gradients", inputs=X.tolist(), target=rows, params={"n_steps": 16}
    )
    assert npz(out)["target"].tolist() == want.target
    np.testing.assert_allclose(npz(out)["attributions"], want.attributions[0], rtol=1e-5)
    # "predicted" fills in beside per-example targets: each unlabelled example's argmax
    rc = attribute(
        tmp_path,
        *IG,
        "--inputs",
        str(tmp_path / "x.jsonl"),
        "--target",
        "predicted",
        "--batch-size",
        "4",
        "--output",
        str(tmp_path / "p.npz"),
    )
    assert rc == 0
    with torch.no_grad():
        argmax = lm.model(torch.as_tensor(X)).argmax(-1).tolist()
    labels = lm.spec.output.labels
    rows = [
        argmax[i] if t is None else (labels.index(t) if isinstance(t, str) else t)
        for i, t in enumerate(mixed)
    ]
    want = serve(
        lm, method="integrated_gradients", inputs=X.tolist(), target=rows, params={"n_steps": 16}
    )
    assert npz(tmp_path / "p.npz")["target"].tolist() == rows == want.target
    np.testing.assert_allclose(
        npz(tmp_path / "p.npz")["attributions"], want.attributions[0], rtol=1e-5
    )
    # a JSON list given as --target: one per example of the whole file, cut with the chunks
    rows = [i % 3 for i in range(len(X))]
    src = write_inputs(tmp_path / "x.npy")
    assert (
        attribute(
            tmp_path,
            *IG,
            "--inputs",
            str(src),
            "--target",
            json.dumps(rows),
            "--batch-size",
            "3",
            "--output",
            str(out),
        )
        == 0
    )
    assert npz(out)["target"].tolist() == rows


def test_per_example_baselines_are_cut_with_the_chunks(
    tmp_path: Path, models: dict[str, Any]
) -> None:
    src = write_inputs(tmp_path / "x.npy")
    base = np.random.default_rng(1).normal(size=X.shape).astype(np.float32)
    np.save(tmp_path / "b.npy", base)
    out = tmp_path / "a.npz"
    assert (
        attribute(
            tmp_path,
            *IG,
            "--inputs",
            str(src),
            "--target",
            "0",
            "--baselines",
            str(tmp_path / "b.npy"),
            "--batch-size",
            "4",
            "--output",
            str(out),
        )
        == 0
    )
    want = serve(
        models["tabular-mlp"],
        method="integrated_gradients",
        inputs=X.tolist(),
        target=0,
        baselines=base.tolist(),
        params={"n_steps": 16},
    )
    np.testing.assert_allclose(npz(out)["attributions"], want.attributions[0], rtol=1e-5)


class Interrupt:
    """``attribute_batch`` counted, and interrupted (Ctrl-C) at call ``stop_at``."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.calls: list[int] = []
        self.stop_at = stop_at

    def __call__(self, lm: Any, spec: Any, request: Any, examples: Any, settings: Any) -> Any:
        if self.stop_at is not None and len(self.calls) == self.stop_at:
            raise KeyboardInterrupt
        self.calls.append(examples.n)
        return ATTRIBUTE_BATCH(lm, spec, request, examples, settings)


def test_an_interrupted_run_resumes_after_its_last_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_inputs(tmp_path / "x.npy")
    args = [*IG, "--inputs", str(src), "--target", "predicted", "--batch-size", "3"]
    assert attribute(tmp_path, *args, "--output", str(tmp_path / "whole.npz")) == 0
    out = tmp_path / "a.npz"
    partial = tmp_path / "a.npz.partial"
    first = Interrupt(stop_at=2)
    monkeypatch.setattr(command, "attribute_batch", first)
    capsys.readouterr()
    assert attribute(tmp_path, *args, "--output", str(out)) == 130
    err = capsys.readouterr().err
    assert "interrupted after 2 of 4 chunks" in err and "again to resume" in err
    assert not out.exists()
    state = json.loads((partial / "state.json").read_text())
    assert state["chunks_done"] == 2 and state["chunk_size"] == 3
    assert sorted(p.name for p in partial.glob("*.npz")) == ["chunk-000000.npz", "chunk-000001.npz"]

    second = Interrupt()
    monkeypatch.setattr(command, "attribute_batch", second)
    assert attribute(tmp_path, *args, "--output", str(out)) == 0
    assert (
        "resuming the interrupted run: 2 of 4 chunks (6 of 10 examples)" in capsys.readouterr().err
    )
    assert second.calls == [3, 1]  # only the chunks left
    whole, got = npz(tmp_path / "whole.npz"), npz(out)
    assert got.keys() == whole.keys()
    for k in whole:
        np.testing.assert_array_equal(got[k], whole[k])
    assert not partial.exists()


@pytest.mark.parametrize(
    "change, why",
    [
        (["--params", '{"n_steps": 8}'], "the options differ"),
        (["--target", "0"], "the options differ"),
        (["--batch-size", "4"], "--batch-size differs"),
        ("input", "the input file changed"),
    ],
)
def test_changed_options_or_input_start_over(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    change: Any,
    why: str,
) -> None:
    src = write_inputs(tmp_path / "x.npy")
    args = {
        "--method": "integrated_gradients",
        "--params": '{"n_steps": 16}',
        "--inputs": str(src),
        "--target": "predicted",
        "--batch-size": "3",
        "--output": str(tmp_path / "a.npz"),
    }
    monkeypatch.setattr(command, "attribute_batch", Interrupt(stop_at=2))
    assert attribute(tmp_path, *[a for kv in args.items() for a in kv]) == 130
    if change == "input":
        write_inputs(src, X[:7] * 2)
    else:
        args[change[0]] = change[1]
    again = Interrupt()
    monkeypatch.setattr(command, "attribute_batch", again)
    capsys.readouterr()
    assert attribute(tmp_path, *[a for kv in args.items() for a in kv]) == 0
    assert f"starting over: {why} since the interrupted run" in capsys.readouterr().err
    n = 7 if change == "input" else 10
    assert sum(again.calls) == n
    assert len(npz(tmp_path / "a.npz")["outputs"]) == n


def http_detail(**body: Any) -> str:
    """The detail the HTTP API answers for this request (all of the file's examples)."""
    with pytest.raises(ServiceError) as info:
        build_work(Settings(), SPECS["tabular-mlp"], AttributionRequest(**body), math.inf)
    return info.value.detail


@pytest.mark.parametrize(
    "args, body, at",
    [
        (["--method", "nope", "--target", "0"], {"method": "nope", "target": 0}, "method"),
        (["--method", "saliency", "--target", "7"], {"method": "saliency", "target": 7}, "target"),
        (
            ["--method", "integrated_gradients", "--target", "0", "--params", '{"n_steps": 5000}'],
            {"method": "integrated_gradients", "target": 0, "params": {"n_steps": 5000}},
            "params.n_steps",
        ),
        (
            ["--method", "saliency", "--target", "0", "wrong-shape"],
            {"method": "saliency", "target": 0},
            "inputs",
        ),
    ],
)
def test_bad_requests_exit_2_with_the_http_apis_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    body: dict[str, Any],
    at: str,
) -> None:
    x = X[:, :3] if "wrong-shape" in args else X
    args = [a for a in args if a != "wrong-shape"]
    src = write_inputs(tmp_path / "x.npy", x)
    loads: list[Any] = []
    monkeypatch.setattr(model_registry, "load", loads.append)  # refused before the model loads
    out = tmp_path / "a.npz"
    assert attribute(tmp_path, *args, "--inputs", str(src), "--output", str(out)) == 2
    err = capsys.readouterr().err
    detail = http_detail(inputs=x.tolist(), **body)
    assert err == f"attrserve attribute: error: {detail} (at {at})\n"
    assert not out.exists() and not tmp_path.joinpath("a.npz.partial").exists()
    assert loads == []


def test_unreadable_files_and_options_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "x.csv").write_text("1,2\n")
    (tmp_path / "ragged.jsonl").write_text(
        '{"inputs": [1, 2, 3, 4, 5, 6, 7, 8]}\n{"inputs": [1]}\n'
    )
    cases = {
        "x.csv": "unknown input format '.csv'",
        "ragged.jsonl": "ragged.jsonl line 2: inputs 'x' has shape [1]; the first line's has [8]",
        "missing.npy": "missing.npy: no such file",
    }
    for name, message in cases.items():
        rc = attribute(
            tmp_path,
            "--method",
            "saliency",
            "--inputs",
            str(tmp_path / name),
            "--output",
            str(tmp_path / "a.npz"),
        )
        assert rc == 2
        assert message in capsys.readouterr().err
    src = write_inputs(tmp_path / "x.npy")
    assert (
        attribute(
            tmp_path,
            "--method",
            "saliency",
            "--inputs",
            str(src),
            "--params",
            "{oops",
            "--output",
            str(tmp_path / "a.npz"),
        )
        == 2
    )
    assert "--params is not valid JSON" in capsys.readouterr().err
    assert (
        attribute(
            tmp_path,
            "--method",
            "saliency",
            "--inputs",
            str(src),
            "--batch-size",
            "100000",
            "--output",
            str(tmp_path / "a.npz"),
        )
        == 2
    )
    assert "--batch-size 100000 must be 1..256" in capsys.readouterr().err


def test_library_pieces_compose(tmp_path: Path, models: dict[str, Any]) -> None:
    """What Ray Data calls: read, attribute chunk by chunk, write."""
    spec = SPECS["tabular-mlp"]
    ex = offline.read_examples(write_inputs(tmp_path / "x.parquet", targets=[0, 1] * 5), spec)
    assert ex.n == 10 and ex.targets == [0, 1] * 5 and ex.raw is None
    request = {"method": "saliency", "target": None}
    cols = [
        offline.attribute_batch(
            models["tabular-mlp"], spec, request, ex.slice(a, a + 4), Settings()
        )
        for a in range(0, ex.n, 4)
    ]
    offline.write_output(tmp_path / "a.npz", cols)
    got = npz(tmp_path / "a.npz")
    assert got["target"].tolist() == [0, 1] * 5
    want = serve(models["tabular-mlp"], method="saliency", inputs=X.tolist(), target=[0, 1] * 5)
    np.testing.assert_allclose(got["attributions"], want.attributions[0], rtol=1e-6)


def test_ray_needs_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "service.cli.ray", None)  # import fails as if absent
    assert cli.main(["ray", "serve"]) == 2
    assert "install attrserve[ray]" in capsys.readouterr().err
    src = write_inputs(tmp_path / "x.npy")
    argv = ["--method", "saliency", "--inputs", str(src), "--output", str(tmp_path / "a.npz")]
    assert attribute(tmp_path, *argv, "--ray") == 2
    assert "install attrserve[ray]" in capsys.readouterr().err
    assert attribute(tmp_path, *argv, "--address", "ray://x:10001") == 2
    assert "--address needs --ray" in capsys.readouterr().err


@pytest.mark.processes
def test_the_console_script(tmp_path: Path) -> None:
    src = write_inputs(tmp_path / "x.npy")
    out = tmp_path / "a.parquet"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli.main",
            "attribute",
            "--model",
            "tabular-mlp",
            "--method",
            "saliency",
            "--inputs",
            str(src),
            "--target",
            "predicted",
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "wrote 10 examples" in run.stderr and "Traceback" not in run.stderr
    assert pq.read_table(out).num_rows == 10


def test_default_chunks_fit_the_cost_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_inputs(tmp_path / "x.npy")
    monkeypatch.setenv("ATTRSERVE_MAX_COST", "70")  # IG, 16 steps: 17 rows an example
    args = [*IG, "--inputs", str(src), "--target", "0"]
    calls = Interrupt()
    monkeypatch.setattr(command, "attribute_batch", calls)
    assert attribute(tmp_path, *args, "--output", str(tmp_path / "a.npz")) == 0
    assert calls.calls == [4, 4, 2]
    assert attribute(tmp_path, *args, "--batch-size", "5", "--output", str(tmp_path / "b.npz")) == 2
    assert "the limit is 70: send fewer examples" in capsys.readouterr().err


def test_interrupted_before_a_chunk_finished_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_inputs(tmp_path / "x.npy")
    monkeypatch.setattr(command, "attribute_batch", Interrupt(stop_at=0))
    out = tmp_path / "a.npz"
    assert (
        attribute(
            tmp_path,
            "--method",
            "saliency",
            "--target",
            "0",
            "--inputs",
            str(src),
            "--output",
            str(out),
        )
        == 130
    )
    assert "nothing was kept" in capsys.readouterr().err
    assert not out.exists() and not tmp_path.joinpath("a.npz.partial").exists()


TWO_INPUT_TOML = """
[[models]]
id = "two-input"
source = "python:tests.service.factory:two_input"
labels = ["first", "second"]
inputs = [{ name = "a", dtype = "float32", shape = ["N", 3] },
          { name = "b", dtype = "float32", shape = ["N", 2] }]
"""


@pytest.mark.parametrize("fmt", [".npz", ".pt", ".jsonl", ".parquet"])
def test_multi_input_models_by_input_name(tmp_path: Path, fmt: str) -> None:
    """out[0] = a.sum() + 2 b0: input x gradient is a for a and (2 b0, 0) for b."""
    (tmp_path / "models.toml").write_text(TWO_INPUT_TOML)
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(7, 3)).astype(np.float32), rng.normal(size=(7, 2)).astype(np.float32)
    src = tmp_path / f"ab{fmt}"
    if fmt == ".npz":
        np.savez(src, b=b, a=a)
    elif fmt == ".pt":
        torch.save({"a": torch.from_numpy(a), "b": torch.from_numpy(b)}, src)
    elif fmt == ".parquet":
        pq.write_table(pa.table({"a": a.tolist(), "b": b.tolist()}), src)
    else:
        src.write_text(
            "".join(
                json.dumps({"inputs": {"a": x.tolist(), "b": y.tolist()}}) + "\n"
                for x, y in zip(a, b, strict=True)
            )
        )
    out = tmp_path / "attr.npz"
    rc = cli.main(
        [
            "attribute",
            "--model",
            "two-input",
            "--models",
            str(tmp_path / "models.toml"),
            "--method",
            "input_x_gradient",
            "--target",
            "first",
            "--inputs",
            str(src),
            "--batch-size",
            "3",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    got = npz(out)
    np.testing.assert_allclose(got["attributions_a"], a, rtol=1e-6)
    np.testing.assert_allclose(got["attributions_b"], np.stack([2 * b[:, 0], 0 * b[:, 1]], 1))
    np.testing.assert_allclose(got["outputs"], a.sum(1) + 2 * b[:, 0], rtol=1e-5)


def test_torch_threads_follow_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ATTRSERVE_TORCH_THREADS sets the CLI's torch threads, as it sets a worker's."""
    inputs = write_inputs(tmp_path / "x.npy")
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2
    monkeypatch.setenv("ATTRSERVE_TORCH_THREADS", str(want))
    try:
        rc = attribute(tmp_path, "--inputs", str(inputs), "--output", str(tmp_path / "a.npz"),
                       "--method", "saliency", "--target", "0", "--quiet")  # fmt: skip
        assert rc == 0
        assert torch.get_num_threads() == want
    finally:
        torch.set_num_threads(before)
