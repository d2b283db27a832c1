"""What a developer's CPU never sees, checked on one CUDA device in under 8 minutes.

Run: ``python -m benchmarks.gpu_check [--out DIR] [--skip-bench]`` (the body of ``make
gpu-check``). The checks:

1. parity: every registered method on the conformance models (``tests.zoo``), float32 on the
   device against float64 on the CPU (``methods.verify``); one row per family, naming the
   worst method; stochastic methods are checked by a seeded repeat on the device instead;
2. fidelity: bfloat16 and float16 against float32 (``precision=..., verify=True``) for
   integrated gradients, saliency and occlusion on the built-in image CNN, layer
   integrated gradients at a small BERT's embeddings, and a small GPT-2's answer attributed
   to its prompt (feature ablation, layer integrated gradients: ``attribute_generation``);
3. service: a real ``attrserve serve`` with the image CNN on the device, 20 requests answered
   as the engine answers on the CPU, device memory flat across them, warm latency;
4. OOM retry: ``internal_batch_size="auto"`` under a capped allocator halves its chunk on real
   out-of-memory errors and still gives the fixed-chunk answer;
5. compile: integrated gradients through ``torch.compile(model)`` equal eager ones; compile
   time and warm speed-up;
6. incremental occlusion: on Hugging Face's ResNet-50, occlusion that recomputes only what
   each window changes (``methods.engine.incremental``, CPU-only by default) against every
   window as a full forward: equal, and which is faster on the device;

then ``python -m benchmarks.real --quick --device cuda`` when that module exists. Each check
reports PASS, FAIL (with a one-line reason) or SKIP and never stops the others; the exit code
is 1 if any failed. Without CUDA it says so in one line ("no CUDA device: ...") and exits 0
without running anything, before importing torch: that
is why the heavy imports sit inside the functions. ``--device cpu`` (a dry run) runs every
check but the OOM one on the CPU.
"""

from __future__ import annotations

import argparse
import base64
import copy
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

REPO = Path(__file__).resolve().parents[1]
#: the whole run, the benchmark included, within make gpu-check's 8 minutes
BUDGET_S = 470.0
BENCH_MODULE = "benchmarks.real"
NO_CUDA = (
    "no CUDA device: gpu-check needs a GPU (an NVIDIA driver and a CUDA build of torch); "
    "run it on a GPU machine (`--device cpu` dry-runs it here)"
)
PARITY_CASES = ("mlp", "cnn", "two_input", "multidim")
PRECISIONS = ("bfloat16", "float16")
#: a served answer may differ from the CPU engine's by this much (max |d| / max |ref|): TF32
#: convolutions, other kernels and chunk orders on the device
SERVICE_TOLERANCE = 1e-2
#: device memory the server may gain between its 2nd and last request (allocator blocks)
MEMORY_SLACK_MIB = 64


@dataclass
class Row:
    """One line of the report."""

    check: str
    result: str  # PASS | FAIL | SKIP
    figures: str
    seconds: float = 0.0
    data: dict[str, Any] = field(default_factory=dict)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:240]


def guarded(name: str, fn: Callable[[], list[Row]]) -> list[Row]:
    """``fn``'s rows, or one FAIL row with the reason: one broken check never hides another."""
    start = time.perf_counter()
    try:
        rows = fn()
    except Exception as exc:
        return [Row(name, "FAIL", one_line(exc), time.perf_counter() - start)]
    took = time.perf_counter() - start
    for row in rows:
        row.seconds = row.seconds or took / len(rows)
    return rows


# -- helpers ------------------------------------------------------------------------------


def _flat(value: Any) -> list[torch.Tensor]:
    from methods.engine.precision import flat

    return flat(value)


def _moved(value: Any, device: str) -> Any:
    """Tensors on ``device``, floating ones in float32; containers kept."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device, torch.float32) if value.is_floating_point() else value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value


def rel_diff(got: Any, ref: Any) -> float:
    """max |got - ref| / max |ref| over every tensor (as ``methods.verify`` measures)."""
    worst = 0.0
    for a, r in zip(_flat(got), _flat(ref), strict=True):
        a64, r64 = a.detach().cpu().double(), r.detach().cpu().double()
        d = float((a64 - r64).abs().max()) if a64.numel() else 0.0
        scale = float(r64.abs().max()) if r64.numel() else 0.0
        worst = max(worst, d / scale if scale > 0 else (0.0 if d == 0 else float("inf")))
    return worst


def _finite(value: Any) -> bool:
    return all(bool(t.isfinite().all()) for t in _flat(value))


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


@contextmanager
def _tf32_off() -> Iterator[None]:
    """TF32 off for cuDNN convolutions and matmuls (on by default for convolutions)."""
    import torch

    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


def _tf32_state() -> str:
    import torch

    on = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    return f"TF32 conv {'on' if on[0] else 'off'}, matmul {'on' if on[1] else 'off'}"


# -- 1. parity ----------------------------------------------------------------------------


@dataclass
class Parity:
    """One method's worst case against the float64 CPU reference."""

    name: str
    status: str  # ok | fail | stochastic | skip
    rel: float = 0.0
    tolerance: float = 0.0
    case: str = ""
    reason: str = ""


def _parity_case(spec: Any, device: str, case_name: str) -> Parity:
    import methods
    from methods.verify import verify
    from tests import zoo
    from tests.methods.conformance_args import kwargs_for

    case = zoo.by_name(case_name)
    model = copy.deepcopy(case.model).float().to(device)
    x = _moved(case.inputs, device)
    kw = {k: _moved(v, device) for k, v in kwargs_for(spec, case).items()}
    if spec.stochastic:  # samples differ by device: the same seed must repeat instead
        a = methods.attribute(model, x, spec.name, seed=7, **kw).attributions
        b = methods.attribute(model, x, spec.name, seed=7, **kw).attributions
        rel, tol = rel_diff(a, b), 1e-5
        ok = rel <= tol and _finite(a)
        return Parity(
            spec.name,
            "stochastic" if ok else "fail",
            rel,
            tol,
            case_name,
            "" if ok else f"{case_name}: seeded repeat differs by {rel:.2g}",
        )
    _, v = verify(model, x, spec.name, **kw)
    if v.ok:
        return Parity(spec.name, "ok", v.max_rel_diff, v.tolerance, case_name)
    reason = f"{case_name}: {v.max_rel_diff:.2g} > {v.tolerance:.0e}"
    if device.startswith("cuda"):  # the usual suspect: TF32 convolutions
        with _tf32_off():
            _, v32 = verify(model, x, spec.name, **kw)
        reason += f"; {v32.max_rel_diff:.2g} with TF32 off"
    return Parity(spec.name, "fail", v.max_rel_diff, v.tolerance, case_name, reason)


def _parity_one(spec: Any, device: str, cases: Collection[str]) -> Parity:
    """The method's first failing case, else its worst one."""
    from tests import zoo
    from tests.methods.conformance_args import applicable

    outs = []
    for case_name in cases:
        if not applicable(spec, zoo.by_name(case_name)):
            continue
        try:
            outs.append(_parity_case(spec, device, case_name))
        except Exception as exc:
            outs.append(
                Parity(spec.name, "fail", case=case_name, reason=f"{case_name}: {one_line(exc)}")
            )
    if not outs:
        return Parity(spec.name, "skip", reason="no conformance model fits")
    failed = [o for o in outs if o.status == "fail"]
    return failed[0] if failed else max(outs, key=_share)


def _share(o: Parity) -> float:
    """How much of its tolerance the method used."""
    if o.tolerance > 0:
        return o.rel / o.tolerance
    return float("inf") if o.rel > 0 else 0.0


def check_parity(
    device: str, cases: Collection[str] = PARITY_CASES, only: Collection[str] | None = None
) -> list[Row]:
    """Every method in float32 on ``device`` against float64 on the CPU: one row per family."""
    from methods import registry

    rows = []
    for family in registry.FAMILIES:
        start = time.perf_counter()
        specs = [s for s in registry.specs() if s.family == family and (not only or s.name in only)]
        if not specs:
            continue
        outs = [_parity_one(s, device, cases) for s in specs]
        exact = [o for o in outs if o.status in ("ok", "fail") and o.case]
        parts = []
        if exact:
            w = max(exact, key=_share)
            parts.append(
                f"{len(outs)} methods on {len(cases)} models; worst {w.name} ({w.case}) "
                f"{w.rel:.2g}/{w.tolerance:.0e}"
            )
        stoch = [o.name for o in outs if o.status == "stochastic"]
        if stoch:
            parts.append(f"seeded repeat only: {', '.join(stoch)}")
        skipped = [f"{o.name} ({o.reason})" for o in outs if o.status == "skip"]
        if skipped:
            parts.append(f"skipped: {', '.join(skipped)}")
        failed = [f"{o.name} ({o.reason})" for o in outs if o.status == "fail"]
        if failed:
            parts.append(f"FAILED: {'; '.join(failed)}")
        if device.startswith("cuda"):
            parts.append(_tf32_state())
        rows.append(
            Row(
                f"parity {family}",
                "FAIL" if failed else "PASS",
                "; ".join(parts),
                time.perf_counter() - start,
                {"methods": [asdict(o) for o in outs]},
            )
        )
    return rows


# -- 2. low-precision fidelity ------------------------------------------------------------


def image_cnn(device: str, n: int = 8) -> tuple[nn.Module, torch.Tensor, list[int]]:
    """The built-in image CNN (trained weights) in float32 on ``device``, n images, labels."""
    import torch

    from model_registry import builtin
    from model_registry.builtin import image

    model, _ = builtin.build("image-cnn")
    x, y = image.make_data(n, torch.Generator().manual_seed(0))
    return model.eval().to(device), x.to(device), [int(v) for v in y]


def tiny_bert(device: str, n: int = 4, length: int = 16) -> tuple[nn.Module, torch.Tensor]:
    """A 2-layer BertForSequenceClassification with seeded random weights, as a module giving
    logits, and token ids."""
    import torch
    from torch import nn
    from transformers import BertConfig, BertForSequenceClassification

    sizes: dict[str, Any] = dict(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        num_labels=2,
    )
    config = BertConfig(**sizes)
    torch.manual_seed(0)

    class Logits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertForSequenceClassification(config)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids).logits

    ids = torch.randint(
        1, config.vocab_size, (n, length), generator=torch.Generator().manual_seed(1)
    )
    return Logits().eval().to(device), ids.to(device)


def _fidelity_rows(name: str, run: Callable[[str], Any], precisions: Collection[str]) -> list[Row]:
    """``run(precision)`` (verified against float32) in each precision: one row."""
    start = time.perf_counter()
    cells, broken, data = [], [], {}
    for p in precisions:
        try:
            r = run(p)
        except Exception as exc:
            broken.append(f"{p}: {one_line(exc)}")
            continue
        f = r.fidelity
        data[p] = f.as_dict()
        if not _finite(r.attributions):
            broken.append(f"{p}: non-finite attributions")
        if not f.checked or f.rel_l2 is None:
            broken.append(f"{p}: not checked")
            continue
        if f.rel_l2 > f.tolerance and not f.fallback:
            broken.append(f"{p}: L2 {f.rel_l2:.2g} over {f.tolerance} but not rerun")
        cell = f"{p}: L2 {f.rel_l2:.2g}, top{f.top_k} {f.topk_agreement:.2f}"
        if f.delta_ratio:
            cell += f", delta {max(f.delta_ratio):.2g}"
        cells.append(cell + (" (rerun in float32)" if f.fallback else ""))
    figures = "; ".join(cells + [f"FAILED {b}" for b in broken])
    row = Row(
        f"fidelity {name}",
        "FAIL" if broken else "PASS",
        figures,
        time.perf_counter() - start,
        data,
    )
    return [row]


def check_fidelity(
    device: str, precisions: Collection[str] = PRECISIONS, n_steps: int = 50, n_images: int = 8
) -> list[Row]:
    """bfloat16 / float16 answers against float32 (relative L2, top-k, delta ratio); a
    causal LM's answer attributed to its prompt too (``attribute_generation``)."""
    import methods

    cnn, images, labels = image_cnn(device, n_images)
    bert, ids = tiny_bert(device)
    window = {"sliding_window_shapes": (3, 4, 4), "strides": (3, 4, 4)}
    cases: list[tuple[str, Any, Any, dict[str, Any]]] = [
        ("integrated_gradients", cnn, images, {"target": labels, "n_steps": n_steps}),
        (
            "layer_integrated_gradients",
            bert,
            ids,
            {"target": 1, "n_steps": n_steps, "layer": "bert.bert.embeddings"},
        ),
        ("saliency", cnn, images, {"target": labels}),
        ("occlusion", cnn, images, {"target": labels, **window}),
    ]

    def tensor_run(method: str, model: Any, x: Any, kw: dict[str, Any]) -> Callable[[str], Any]:
        return lambda p: methods.attribute(model, x, method, precision=p, verify=True, **kw)

    lm, tok, prompt, answer = tiny_gpt2(device)

    def generation_run(method: str, kw: dict[str, Any]) -> Callable[[str], Any]:
        return lambda p: methods.attribute_generation(
            lm, tok, prompt, method, target=answer, baselines="<unk>", precision=p, verify=True,
            **kw,
        )  # fmt: skip

    runs = [(method, tensor_run(method, *rest)) for method, *rest in cases]
    runs += [
        ("generation feature_ablation", generation_run("feature_ablation", {})),
        ("generation layer_integrated_gradients",
         generation_run("layer_integrated_gradients", {"n_steps": n_steps})),
    ]  # fmt: skip
    rows = []
    for name, run in runs:
        rows += guarded(f"fidelity {name}", partial(_fidelity_rows, name, run, precisions))
    return rows


def tiny_gpt2(device: str) -> tuple[nn.Module, Any, str, str]:
    """A 2-layer GPT-2 with seeded random weights on ``device``, its word-level tokenizer, a
    24-token prompt and a 6-token answer."""
    import torch

    from benchmarks.generation import gpt2, tokenizer

    words = ["<unk>", "<bos>", "<eos>", *(f"w{i}" for i in range(200))]
    g = torch.Generator().manual_seed(1)
    pick = lambda n: " ".join(f"w{int(i)}" for i in torch.randint(200, (n,), generator=g))  # noqa: E731
    model = gpt2(layers=2, width=64, heads=4, vocab=len(words)).to(device)
    return model, tokenizer(words), pick(24), pick(6)


# -- 3. the service ------------------------------------------------------------------------


def _gpu_used_mib() -> float | None:
    """Device memory in use (every process), from nvidia-smi; None where it cannot be read."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


class ModelFailed(RuntimeError):
    """The server started but its model failed to load (its load-time device check, say)."""


@contextmanager
def serve(models_toml: str, workdir: Path, ready_timeout_s: float = 180) -> Iterator[str]:
    """A real ``attrserve serve`` subprocess for ``models_toml``, ready; yields its URL."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    (workdir / "models.toml").write_text(models_toml)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTRSERVE_")}
    env.update(ATTRSERVE_DATA_DIR=str(workdir / "data"), ATTRSERVE_WORKERS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    cmd = [
        sys.executable,
        "-m",
        "service.cli.main",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models",
        str(workdir / "models.toml"),
    ]
    log = workdir / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:200] if lines else "(empty log)"

    try:
        end = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited ({proc.returncode}): {tail()}")
            try:
                r = httpx.get(url + "/v1/health/ready", timeout=5)
                body = r.json()
                if r.status_code == 200:
                    break
                failed = {k: m for k, m in body.get("models", {}).items() if m["state"] == "failed"}
                if failed:
                    raise ModelFailed(f"model failed to load: {failed}")
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise TimeoutError(f"server not ready in {ready_timeout_s:.0f} s: {tail()}")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the session started for it: the server and its workers
            proc.wait(10)


def _b64(t: torch.Tensor) -> dict[str, Any]:
    a = t.detach().cpu().contiguous().numpy()
    return {
        "dtype": str(a.dtype),
        "shape": list(a.shape),
        "b64": base64.b64encode(a.tobytes()).decode(),
    }


def _decoded(value: Any) -> torch.Tensor:
    import numpy as np
    import torch

    if isinstance(value, dict):
        a = np.frombuffer(base64.b64decode(value["b64"]), dtype=value["dtype"])
        return torch.from_numpy(a.reshape(value["shape"]).copy())
    return torch.tensor(value)


def _requests(client: Any, n: int, device: str) -> dict[str, Any]:
    """``n`` integrated-gradients requests to model "cnn", each compared with the engine's
    CPU answer; latencies, the device memory after the 2nd and the last, what was wrong."""
    import torch

    import methods
    from model_registry import builtin
    from model_registry.builtin import image

    reference, _ = builtin.build("image-cnn")
    reference.eval()
    out: dict[str, Any] = {"latency_ms": [], "memory_mib": {}, "wrong": [], "worst_rel": 0.0}
    for i in range(n):
        x, y = image.make_data(4, torch.Generator().manual_seed(100 + i))
        body = {
            "method": "integrated_gradients",
            "inputs": _b64(x),
            "target": y.tolist(),
            "params": {"n_steps": 32},
            "output_encoding": "base64",
        }
        t0 = time.perf_counter()
        r = client.post("/v1/models/cnn/attributions", json=body)
        out["latency_ms"].append((time.perf_counter() - t0) * 1e3)
        if i in (1, n - 1) and device.startswith("cuda"):
            out["memory_mib"][i + 1] = _gpu_used_mib()
        if r.status_code != 200:
            out["wrong"].append(f"#{i + 1}: HTTP {r.status_code} {r.text[:120]}")
            continue
        got = _decoded(r.json()["attributions"])
        ref = methods.attribute(reference, x, "integrated_gradients", target=y.tolist(), n_steps=32)
        d = rel_diff(got, ref.attributions)
        out["worst_rel"] = max(out["worst_rel"], d)
        if d > SERVICE_TOLERANCE:
            out["wrong"].append(f"#{i + 1}: rel diff {d:.2g}")
    return out


def check_service(device: str, n_requests: int = 20, ready_timeout_s: float = 120) -> list[Row]:
    """The image CNN served on ``device``: right answers, flat memory, warm latency. A model
    refused by its load-time device check is reported, then served without the check so the
    other figures still come back."""
    import httpx

    where = "cuda:0" if device == "cuda" else device
    toml = f'[[models]]\nid = "cnn"\nsource = "builtin:image-cnn"\ndevice = "{where}"\n'
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, ExitStack() as stack:
        start = time.perf_counter()
        try:
            url = stack.enter_context(serve(toml, Path(tmp), ready_timeout_s))
        except ModelFailed as exc:
            failed.append(one_line(exc))
            toml += "verify_device = false\n"
            url = stack.enter_context(serve(toml, Path(tmp), ready_timeout_s))
        ready_s = time.perf_counter() - start
        client = stack.enter_context(httpx.Client(base_url=url, timeout=120))
        info = client.get("/v1/models/cnn").json()
        got = _requests(client, n_requests, device)
    warm = got["latency_ms"][1:]
    figures = [
        f"{n_requests - len(got['wrong'])}/{n_requests} right (worst rel {got['worst_rel']:.2g})",
        f"warm latency p50 {statistics.median(warm):.1f} ms, max {max(warm):.1f} ms "
        f"(1st {got['latency_ms'][0]:.0f} ms)",
        f"ready in {ready_s:.0f} s",
    ]
    failed += got["wrong"]
    if device.startswith("cuda"):
        first, last = got["memory_mib"].get(2), got["memory_mib"].get(n_requests)
        if first is None or last is None:
            figures.append("device memory unreadable (no nvidia-smi)")
        else:
            figures.append(f"GPU used {first:.0f} -> {last:.0f} MiB over requests 2..{n_requests}")
            if last - first > MEMORY_SLACK_MIB:
                failed.append(f"device memory grew {last - first:.0f} MiB")
    check = info.get("verification") or {}
    if "max_rel_diff" in check:
        figures.append(f"load check rel {check['max_rel_diff']:.2g}/{check.get('tolerance')}")
    if failed:
        figures.append("FAILED: " + "; ".join(failed[:4]))
    row = Row("service resident model", "FAIL" if failed else "PASS", "; ".join(figures))
    row.data = {**got, "model": info, "ready_s": ready_s}
    return [row]


# -- 4. out-of-memory retry ----------------------------------------------------------------


def _wide_cnn() -> nn.Module:
    """Activations of ~1 MiB a row at 3x64x64: a few thousand rows do not fit a small cap."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    ).eval()


def check_oom(device: str, n_steps: int = 512, cap_mib: int = 320) -> list[Row]:
    """Real CUDA OOMs under a capped allocator: "auto" halves its chunk and gets it right."""
    if not device.startswith("cuda"):
        return [Row("oom retry", "SKIP", "needs CUDA (a capped device allocator)")]
    import torch

    import methods
    from methods.engine import batching

    dev = torch.device(device)
    if dev.index is None:  # the allocator's cap takes an indexed device
        dev = torch.device("cuda", torch.cuda.current_device())
    model = _wide_cnn().to(dev)
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(2)).to(dev)
    kw: dict[str, Any] = {"target": 3, "n_steps": n_steps}
    with _tf32_off():  # chunks of other sizes may pick other conv kernels: compare exactly
        fixed = methods.attribute(model, x, "integrated_gradients", internal_batch_size=64, **kw)
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = torch.cuda.memory_reserved(dev) + cap_mib * 2**20
        ooms = torch.cuda.memory_stats(dev).get("num_ooms", 0)
        try:
            batching.set_memory_budget(1 << 40)  # the estimate would say "it all fits"
            torch.cuda.set_per_process_memory_fraction(cap / total, dev)
            torch.cuda.reset_peak_memory_stats(dev)
            auto = methods.attribute(
                model, x, "integrated_gradients", internal_batch_size="auto", **kw
            )
            peak = torch.cuda.max_memory_reserved(dev)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, dev)
            batching.set_memory_budget(None)  # by device again (this process sets none)
            torch.cuda.empty_cache()
    n_ooms = torch.cuda.memory_stats(dev).get("num_ooms", 0) - ooms
    rows = auto.params.get("internal_batch_size")
    d = rel_diff(auto.attributions, fixed.attributions)
    figures = (
        f"{n_ooms} OOMs under a {cap / 2**20:.0f} MiB cap; chunk {rows} rows of "
        f"{n_steps * x.shape[0]}; rel diff vs fixed 64-row chunks {d:.2g}; "
        f"peak reserved {peak / 2**20:.0f} MiB"
    )
    problems = []
    if n_ooms < 1:
        problems.append("no OOM was provoked")
    if d > 1e-5:
        problems.append(f"answer differs ({d:.2g})")
    if problems:
        figures += "; FAILED: " + "; ".join(problems)
    data = {"ooms": n_ooms, "chunk_rows": rows, "rel_diff": d, "cap_bytes": cap}
    return [Row("oom retry", "FAIL" if problems else "PASS", figures, data=data)]


# -- 5. torch.compile ----------------------------------------------------------------------


def check_compile(
    device: str, backend: str = "inductor", n_steps: int = 50, batch: int = 8, timing_s: float = 10
) -> list[Row]:
    """IG through ``torch.compile(model)`` against eager: equal, and how much faster."""
    import torch

    import methods
    from benchmarks.models import cnn
    from benchmarks.timing import interleaved_ms
    from methods.verify import TOLERANCE

    torch.manual_seed(0)
    model = cnn().to(device)
    x = torch.randn(batch, 3, 64, 64, generator=torch.Generator().manual_seed(3)).to(device)
    compiled = torch.compile(model, backend=backend)

    def run(m: Any) -> Any:
        out = methods.attribute(
            m, x, "integrated_gradients", target=1, n_steps=n_steps
        ).attributions
        _sync(device)
        return out

    eager = run(model)
    t0 = time.perf_counter()
    got = run(compiled)
    compile_s = time.perf_counter() - t0
    got = run(compiled)  # a second shape, if any, has compiled now
    d = rel_diff(got, eager)
    ms_eager, ms_compiled = interleaved_ms(
        [lambda: run(model), lambda: run(compiled)], repeat=10, budget_s=timing_s
    )
    tol = TOLERANCE[torch.float32]
    figures = (
        f"rel diff {d:.2g} (tol {tol:.0e}); compile {compile_s:.1f} s; warm "
        f"{ms_eager:.2f} -> {ms_compiled:.2f} ms ({ms_eager / ms_compiled:.2f}x); {backend}"
    )
    ok = d <= tol
    data = {"rel_diff": d, "compile_s": compile_s, "eager_ms": ms_eager, "compiled_ms": ms_compiled}
    return [
        Row(
            "torch.compile IG",
            "PASS" if ok else "FAIL",
            figures if ok else figures + "; FAILED: answer differs",
            data=data,
        )
    ]


# -- 6. incremental occlusion -------------------------------------------------------------


def check_incremental(
    device: str, images: int = 4, size: int = 224, tiny: bool = False
) -> list[Row]:
    """Occlusion (16 px windows) on Hugging Face's ResNet-50 with and without the incremental
    path: the same answer, and the time of each (whether the path should be on for CUDA)."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    import methods
    from methods.engine import incremental

    torch.manual_seed(0)
    cfg = ResNetConfig(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 64]) if tiny else None
    cfg = cfg or ResNetConfig()  # ResNet-50
    hf = ResNetForImageClassification(cfg).eval().to(device)
    model = lambda v: hf(pixel_values=v).logits  # noqa: E731
    x = torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(4)).to(device)
    kw = {"target": 1, "sliding_window_shapes": (3, 16, 16), "strides": (3, 16, 16)}

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = hf

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return model(pixel_values)

    wrapped = Wrapped().eval()

    def run(m: Any) -> tuple[Any, float, str]:
        start = time.perf_counter()
        res = methods.attribute(m, x, "occlusion", **kw)
        _sync(device)
        return res.attributions, time.perf_counter() - start, res.params["strategy"]

    before = set(incremental.DEVICES)
    incremental.DEVICES.add(x.device.type)
    # TF32 off: the two paths convolve boxes and whole maps, which TF32 rounds differently
    # (rel diff 0.035 on an H200); what is checked is the path, in float32
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        run(wrapped)  # the trace and the first chunk's allocations
        fast, fast_s, strategy = run(wrapped)
        run(model)  # a plain callable (never incremental): its first chunk's allocations
        plain, plain_s, _ = run(model)
    finally:
        incremental.DEVICES.clear()
        incremental.DEVICES.update(before)
        torch.backends.cudnn.allow_tf32 = tf32
    d = rel_diff(fast, plain)
    tol = 1e-3  # float32 around a difference of two outputs
    figures = (
        f"rel diff {d:.2g} (tol {tol:.0e}, TF32 off); {strategy}; incremental {fast_s:.3f} s, full "
        f"forwards {plain_s:.3f} s ({plain_s / fast_s:.2f}x); on by default here: "
        f"{x.device.type in incremental.DEVICES}"
    )
    problems = [] if strategy == "incremental" else ["the incremental path was not taken"]
    problems += [] if d <= tol else ["answers differ"]
    if problems:
        figures += "; FAILED: " + "; ".join(problems)
    data = {"rel_diff": d, "incremental_s": fast_s, "plain_s": plain_s, "strategy": strategy}
    return [Row("incremental occlusion", "FAIL" if problems else "PASS", figures, data=data)]


# -- 7. channels-last inputs ---------------------------------------------------------------


def check_channels_last(
    device: str, images: int = 4, size: int = 224, n_steps: int = 16, tiny: bool = False
) -> list[Row]:
    """Integrated gradients on Hugging Face's ResNet-50 with its images fed channels-last and
    as given (``methods.engine.layout``, on by default for the CPU only): the same answer, and
    the time of each (whether CUDA should be on the list)."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    import methods
    from methods.engine import layout

    torch.manual_seed(0)
    cfg = ResNetConfig(depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 64, 64]) if tiny else None
    hf = ResNetForImageClassification(cfg or ResNetConfig()).eval().to(device)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = hf

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.model(pixel_values=pixel_values).logits  # type: ignore[no-any-return]

    model = Logits().eval()
    x = torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(5)).to(device)

    def run(on: tuple[str, ...]) -> tuple[Any, float]:
        layout.DEVICES = on
        methods.attribute(model, x, "integrated_gradients", target=1, n_steps=n_steps)  # warm
        _sync(device)
        start = time.perf_counter()
        res = methods.attribute(model, x, "integrated_gradients", target=1, n_steps=n_steps)
        _sync(device)
        return res.attributions, time.perf_counter() - start

    before = layout.DEVICES
    kind = x.device.type
    try:
        with _tf32_off():  # what is compared is the layout, in float32
            nhwc, nhwc_s = run((kind,))
            nchw, nchw_s = run(())
    finally:
        layout.DEVICES = before
    d = rel_diff(nhwc, nchw)
    tol = 1e-4
    figures = (
        f"rel diff {d:.2g} (tol {tol:.0e}, TF32 off); IG {n_steps} steps, {images} image(s): "
        f"channels-last {nhwc_s:.3f} s, as given {nchw_s:.3f} s ({nhwc_s / nchw_s:.2f}x); on by "
        f"default here: {kind in before}"
    )
    ok = d <= tol
    data = {"rel_diff": d, "channels_last_s": nhwc_s, "as_given_s": nchw_s}
    return [Row("channels-last inputs", "PASS" if ok else "FAIL",
                figures if ok else figures + "; FAILED: answers differ", data=data)]  # fmt: skip


# -- the benchmark, the report, the command ------------------------------------------------


def run_bench(device: str, timeout_s: float, module: str = BENCH_MODULE) -> tuple[Row, str]:
    """``python -m <module> --quick --device <device>``: its row and its output."""
    if importlib.util.find_spec(module) is None:
        return Row("bench " + module, "SKIP", f"{module} not present"), ""
    start = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", module, "--quick", "--device", device],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            exc.stdout.decode(errors="replace")
            if isinstance(exc.stdout, bytes)
            else exc.stdout or ""
        )
        row = Row(
            "bench " + module,
            "FAIL",
            f"timed out after {timeout_s:.0f} s",
            time.perf_counter() - start,
        )
        return row, out
    took = time.perf_counter() - start
    if p.returncode != 0:
        err = [ln for ln in p.stderr.splitlines() if ln.strip()]
        reason = f"exit {p.returncode}: {err[-1][:200] if err else 'no stderr'}"
        tail = "\n".join(err[-25:])  # the traceback: where it broke
        return Row("bench " + module, "FAIL", reason, took), f"{p.stdout}\n{tail}"
    lines = sum(1 for ln in p.stdout.splitlines() if ln.startswith("|"))
    return Row("bench " + module, "PASS", f"exit 0; {lines} table lines (below)", took), p.stdout


def table(rows: list[Row]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| check | result | figures | seconds |", "|---|---|---|---|"]
    lines += [f"| {r.check} | {r.result} | {cell(r.figures)} | {r.seconds:.1f} |" for r in rows]
    return "\n".join(lines)


def checks(device: str) -> list[tuple[str, Callable[[], list[Row]]]]:
    return [
        ("parity", lambda: check_parity(device)),
        ("fidelity", lambda: check_fidelity(device)),
        ("service resident model", lambda: check_service(device)),
        ("oom retry", lambda: check_oom(device)),
        ("torch.compile IG", lambda: check_compile(device)),
        # the CPU dry run on one image (four take ~2 minutes there)
        (
            "incremental occlusion",
            lambda: check_incremental(device, images=4 if "cuda" in device else 1),
        ),
        ("channels-last inputs", lambda: check_channels_last(device)),
    ]


def _driver_present() -> bool:
    """Whether an NVIDIA GPU may be here, asked without importing torch."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return (
        Path("/proc/driver/nvidia/gpus").is_dir()
        or any(Path("/dev").glob("nvidia[0-9]*"))
        or shutil.which("nvidia-smi") is not None
    )


def _environment(device: str) -> dict[str, Any]:
    import platform

    import torch

    env: dict[str, Any] = {
        "device": device,
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, help="also write gpu_check.md and gpu_check.json here")
    parser.add_argument("--skip-bench", action="store_true", help=f"do not run {BENCH_MODULE}")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": a dry run
    parser.add_argument(
        "--driver",
        action="store_true",
        help="only ask for an NVIDIA driver (no torch import): exit 0 if one is here, else "
        "print why not and exit 1 (make gpu-check asks this before installing anything)",
    )
    args = parser.parse_args(argv)
    if args.driver:
        present = _driver_present()
        if not present:
            print(NO_CUDA)
        return 0 if present else 1
    if args.device.startswith("cuda") and not _driver_present():
        print(NO_CUDA)
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    start = time.perf_counter()
    rows: list[Row] = []
    for name, fn in checks(args.device):
        got = guarded(name, fn)
        rows += got
        took = sum(r.seconds for r in got)
        print(
            f"[gpu-check] {name}: {', '.join(r.result for r in got)} ({took:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    bench_out = ""
    if not args.skip_bench:
        left = BUDGET_S - (time.perf_counter() - start)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()  # this process's cached blocks, for the benchmark's use
        if left < 30:
            rows.append(Row("bench " + BENCH_MODULE, "SKIP", f"{left:.0f} s of the budget left"))
        else:
            row, bench_out = run_bench(args.device, left)
            rows.append(row)
    env = _environment(args.device)
    total = time.perf_counter() - start
    counts = {k: sum(r.result == k for r in rows) for k in ("PASS", "FAIL", "SKIP")}
    where = env.get("gpu", args.device)
    head = (
        f"gpu-check on {where} (torch {env['torch']}, Python {env['python']}): "
        f"{counts['PASS']} pass, {counts['FAIL']} fail, {counts['SKIP']} skip in {total:.0f} s"
    )
    report = table(rows)
    if bench_out.strip():
        print(f"## {BENCH_MODULE}\n\n{bench_out.strip()}\n")
    print(head + "\n\n" + report)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        bench_md = f"\n\n## {BENCH_MODULE}\n\n{bench_out.strip()}\n" if bench_out.strip() else "\n"
        (args.out / "gpu_check.md").write_text(f"{head}\n\n{report}{bench_md}")
        doc = {
            "environment": env,
            "seconds": total,
            "rows": [asdict(r) for r in rows],
            "bench_output": bench_out,
        }
        (args.out / "gpu_check.json").write_text(json.dumps(doc, indent=2, default=str))
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
