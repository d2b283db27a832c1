"""TCAV and TracIn: attrserve's cached concepts and persisted influence index against Captum's
per-call library code, on the same model, data and settings.

    python -m benchmarks.concepts_influence [--train 5000] [--queries 20]

(1) TCAV on image-cnn (its built-in concept sets: 2 concepts, 6 random sets, 2 layers, 20
    input images, sent base64): time per query over HTTP once the CAVs are cached, and the
    first (cold) query, against Captum's ``TCAV.interpret`` with the same experimental sets
    (each concept against each random set, and every ordered pair of random sets, which the
    significance test needs), warm (its CAVs saved on disk by the call before) and cold.
(2) TracIn on tabular-mlp's and image-cnn's architectures trained by SGD on ``--train`` rows
    of their data, 3 checkpoints: the time of one influence query (8 test examples, top 5)
    over HTTP from the built index, against Captum's
    ``TracInCP.influence`` per call (it recomputes the training gradients each time); and the
    index's build time (the job, from submission to ready) and size on disk, with and without
    random projection (``tracin_cp`` vs ``tracin_cp_fast_rand_proj``, projection_dim 32).
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
from torch import nn

from benchmarks.load import start, stop
from benchmarks.timing import table
from model_registry.builtin import build, image, tabular

LAYERS = ["features.3", "classifier.1"]


def median_ms(fn: Any, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def tcav(queries: int) -> list[list[Any]]:
    from captum.attr import LayerGradientXActivation
    from captum.concept import TCAV, Concept
    from torch.utils.data import DataLoader, TensorDataset

    inputs = image.squares_in(0, 20, torch.Generator().manual_seed(1))
    sets = image.concept_sets()
    concepts, randoms = ["bright-top-left", "dim-noise"], [f"random-{i}" for i in range(6)]
    body = {
        "inputs": b64(inputs),
        "target": 0,
        "concepts": concepts,
        "random_concepts": randoms,
        "layers": LAYERS,
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start("attrserve", data_dir=tmp, workers=1, torch_threads=1)
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                t0 = time.perf_counter()
                first = c.post("/v1/models/image-cnn/tcav", json=body)
                cold = (time.perf_counter() - t0) * 1e3
                assert first.status_code == 200, first.text
                warm = median_ms(lambda: c.post("/v1/models/image-cnn/tcav", json=body), queries)
        finally:
            stop(proc)
    model, _ = build("image-cnn")
    model.eval()
    torch.set_num_threads(1)
    objs = {
        n: Concept(i, n, DataLoader(TensorDataset(sets[n]), batch_size=30))
        for i, n in enumerate(concepts + randoms)
    }
    experiments = [[objs[c], objs[r]] for c in concepts for r in randoms]
    experiments += [[objs[a], objs[b]] for a in randoms for b in randoms if a != b]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captum = TCAV(
            model,
            LAYERS,
            save_path=tmp,
            layer_attr_method=LayerGradientXActivation(model, None, multiply_by_inputs=False),
        )
        t0 = time.perf_counter()
        captum.interpret(inputs, experiments, target=0)
        captum_cold = (time.perf_counter() - t0) * 1e3
        captum_warm = median_ms(
            lambda: captum.interpret(inputs, experiments, target=0), max(3, queries // 4)
        )
    return [
        ["TCAV, first query (CAVs trained)", cold, captum_cold, captum_cold / cold],
        ["TCAV, CAVs cached", warm, captum_warm, captum_warm / warm],
    ]


#: the influence cases: a built-in's architecture, its data, and its input's name
CASES = {
    "tabular-mlp": (tabular.TabularMLP, tabular.make_data, "x"),
    "image-cnn": (image.ImageCNN, image.make_data, "image"),
}


def trained(case: str, n: int, out: Path) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """The case's model trained by SGD on ``n`` rows of its data, a checkpoint saved after
    each of 3 epochs (path, lr), the data saved as ``train.npz``."""
    make, data, name = CASES[case]
    x, y = data(n, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = make()
    loss_fn = nn.CrossEntropyLoss()
    saved = []
    for i, lr in enumerate((0.2, 0.1, 0.05), 1):
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        for start_ in range(0, n, 64):
            opt.zero_grad()
            loss_fn(model(x[start_ : start_ + 64]), y[start_ : start_ + 64]).backward()
            opt.step()
        path = out / f"checkpoint-{i}.pt"
        torch.save(model.state_dict(), path)
        saved.append((str(path), lr))
    np.savez(out / "train.npz", **{name: x.numpy(), "labels": y.numpy()})
    return x, y, saved


def influence(case: str, n_train: int, queries: int) -> tuple[list[list[Any]], list[list[Any]]]:
    from captum.influence import TracInCP
    from torch.utils.data import TensorDataset

    rows, builds = [], []
    make, data, _ = CASES[case]
    test_x, test_y = data(8, torch.Generator().manual_seed(9))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        x, y, checkpoints = trained(case, n_train, root)
        cps = ", ".join(f'{{ path = "{p}", lr = {lr} }}' for p, lr in checkpoints)
        toml = ""
        for name, extra in (
            ("full", 'method = "tracin_cp"'),
            ("projected", 'method = "tracin_cp_fast_rand_proj"\nprojection_dim = 32'),
        ):
            toml += (
                f'[[models]]\nid = "{name}"\nsource = "builtin:{case}"\n\n'
                f'[models.influence]\ntrain_data = "{root / "train.npz"}"\n'
                f"checkpoints = [{cps}]\n{extra}\n\n"
            )
        (root / "models.toml").write_text(toml)
        proc, url = start(
            "attrserve",
            data_dir=root / "data",
            models=root / "models.toml",
            workers=1,
            torch_threads=1,
        )
        try:
            with httpx.Client(base_url=url, timeout=600) as c:
                for name in ("full", "projected"):
                    while (state := c.get(f"/v1/models/{name}").json()["influence"])[
                        "status"
                    ] != "ready":
                        assert state["status"] != "failed", state
                        time.sleep(0.05)
                    job = c.get(f"/v1/jobs/{state['job_id']}").json()
                    took = _seconds(job["finished_at"]) - _seconds(job["started_at"])
                    builds.append([case, state["method"], state["n_train"], took, state["bytes"]])
                body = {"inputs": b64(test_x), "labels": test_y.tolist(), "k": 5}
                served = {
                    name: median_ms(
                        lambda n=name: c.post(f"/v1/models/{n}/influence", json=body), queries
                    )
                    for name in ("full", "projected")
                }
        finally:
            stop(proc)
        model = make()
        lrs = dict(checkpoints)

        def load(m: nn.Module, path: str) -> float:
            m.load_state_dict(torch.load(path))
            return lrs[path]

        torch.set_num_threads(1)
        captum = TracInCP(
            model,
            TensorDataset(x, y),
            [p for p, _ in checkpoints],
            checkpoints_load_func=load,
            loss_fn=nn.CrossEntropyLoss(reduction="sum"),
            batch_size=256,
            sample_wise_grads_per_batch=True,
        )
        ref = median_ms(lambda: captum.influence((test_x, test_y), k=5), 3)
    for name in ("full", "projected"):
        rows.append(
            [f"{case}: influence query, index {name}", served[name], ref, ref / served[name]]
        )
    return rows, builds


def _seconds(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def b64(x: torch.Tensor) -> dict[str, Any]:
    """A tensor in the wire's base64 form (what a client sending images sends)."""
    a = np.ascontiguousarray(x.numpy(), dtype="<f4")
    return {
        "dtype": "float32",
        "shape": list(a.shape),
        "b64": base64.b64encode(a.tobytes()).decode(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--queries", type=int, default=20)
    args = parser.parse_args()
    rows = tcav(args.queries)
    builds: list[list[Any]] = []
    for case in CASES:
        more, built = influence(case, args.train, args.queries)
        rows += more
        builds += built
    heads = ["case", "attrserve ms (HTTP)", "Captum ms", "Captum / attrserve"]
    print(table(heads, rows))
    print()
    print(
        table(["model", "method", "n_train", "build s (its job, started to done)", "bytes"], builds)
    )


if __name__ == "__main__":
    main()
