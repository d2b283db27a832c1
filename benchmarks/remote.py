"""Explaining a model served elsewhere: attrserve's remote source against Captum calling the
same predictor, side by side in one process.

    python -m benchmarks.remote [--examples 64] [--kernel-samples 64]

A real KServe predictor (``tests.service.remote.predictor``: the built-in tabular MLP and
image CNN behind a ``kserve.ModelServer`` in a subprocess, on this machine) answers every
forward; the CNN's features are 16 patches of 8x8 pixels. Rows:

- attrserve: ``methods.attribute`` on the ``remote:kserve-v1`` model (what a server worker
  runs): perturbations batched into calls of ``max_batch`` instances, ``max_concurrency`` calls
  in flight;
- Captum, one example at a time, with a forward that posts its batch to the predictor once per
  forward (as a backend would write it; Captum's default of one perturbation per forward);
- Captum given the whole batch at once (same forward);
- attrserve on the same model held locally: the price of the network hop.

Each is timed once (a run is seconds of network calls); the table gives seconds, calls made
and ratios to attrserve's remote row.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch

import methods
from benchmarks.timing import table

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_predictor(port: int, folder: Path) -> subprocess.Popen[bytes]:
    log = (folder / "predictor.log").open("wb")
    cmd = [sys.executable, "-m", "tests.service.remote.predictor", str(port),
           str(folder / "auth.log")]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/models/mlp/ready").status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the predictor did not start: " + (folder / "predictor.log").read_text())


class Counted:
    """Captum's forward: one POST of the batch to the predictor, counted."""

    def __init__(self, url: str) -> None:
        self.url, self.calls = url, 0
        self.client = httpx.Client()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        r = self.client.post(self.url, json={"instances": x.tolist()})
        r.raise_for_status()
        return torch.tensor(r.json()["predictions"])


def timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.remote", description=__doc__)
    p.add_argument("--examples", type=int, default=64)
    p.add_argument("--kernel-samples", type=int, default=64)
    args = p.parse_args(argv)

    from captum.attr import FeatureAblation, KernelShap

    import model_registry
    from model_registry.sources.remote import RemoteModel, RemoteSpec
    from tests.service.remote.predictor import cnn, mlp

    folder = Path(tempfile.mkdtemp(prefix="attrserve-remote-bench-"))
    port = free_port()
    proc = start_predictor(port, folder)
    url = f"http://127.0.0.1:{port}"
    try:
        specs = {s.id: s for s in model_registry.builtin_specs()}
        g = torch.Generator().manual_seed(0)
        # the CNN's features: 16 patches of 8x8 pixels, all three channels together
        patches = torch.arange(16).reshape(4, 4).repeat_interleave(8, 0).repeat_interleave(8, 1)
        models = [
            ("tabular MLP", "tabular-mlp", "mlp", mlp(),
             torch.linspace(-2, 2, args.examples * 8).reshape(args.examples, 8), {}),
            ("image CNN", "image-cnn", "cnn", cnn(),
             torch.rand(args.examples, 3, 32, 32, generator=g),
             {"feature_mask": patches.expand(1, 3, 32, 32)}),
        ]  # fmt: skip
        rows: list[list[Any]] = []
        for model_label, spec_id, name_there, local, x, masks in models:
            remote = RemoteModel(specs[spec_id], RemoteSpec("kserve-v1", url, name_there), {})
            forward = Counted(f"{url}/v1/models/{name_there}:predict")
            kernel = {"n_samples": args.kernel_samples}
            cases = [
                ("feature ablation", "feature_ablation", FeatureAblation, masks),
                ("KernelSHAP", "kernel_shap", KernelShap, {**kernel, **masks}),
            ]
            for label, name, cls, kw in cases:
                label = f"{model_label}, {label}"
                before = remote.calls
                t_ours, _ = timed(methods.attribute, remote, x, name, target=1, seed=0, **kw)
                ours_calls = remote.calls - before
                t_local, _ = timed(methods.attribute, local, x, name, target=1, seed=0, **kw)
                forward.calls = 0
                explainer = cls(forward)
                t_one = sum(
                    timed(explainer.attribute, x[i : i + 1], target=1, **kw)[0]
                    for i in range(len(x))
                )
                one_calls, forward.calls = forward.calls, 0
                t_whole, _ = timed(explainer.attribute, x, target=1, **kw)
                whole_calls = forward.calls
                rows += [
                    [label, "attrserve (remote)", t_ours, ours_calls, 1.0],
                    [label, "Captum, one example at a time", t_one, one_calls, t_one / t_ours],
                    [label, "Captum, the whole batch", t_whole, whole_calls, t_whole / t_ours],
                    [label, "attrserve (model held locally)", t_local, 0, t_local / t_ours],
                ]
        print(f"\n## Remote models: {args.examples} examples each, the built-in tabular MLP and "
              "image CNN (16 patches of 8x8) behind a kserve ModelServer on this machine\n"
              )  # fmt: skip
        print(table(["method", "who", "seconds", "predictor calls", "x attrserve's time"], rows))
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
