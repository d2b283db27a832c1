"""A real KServe predictor for the remote-model tests: ``python -m tests.service.remote.predictor
PORT AUTH_LOG``. It hosts the built-in tabular MLP (the same weights attrserve builds) under several
names, each behaving as a predictor in trouble does:

- ``mlp``: answers right (V1 ``instances`` and V2 ``inputs``);
- ``mlp-flaky``: answers 500 to every other call (a retry gets through);
- ``mlp-500``: always 500; ``mlp-shape``: one score per instance, not three;
- ``mlp-slow``: answers right after 2 s.

Every call's ``Authorization`` header is appended to the file AUTH_LOG, so a test can check
that credentials arrive."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer

import model_registry


def mlp() -> torch.nn.Module:
    spec = next(s for s in model_registry.builtin_specs() if s.id == "tabular-mlp")
    model: torch.nn.Module = model_registry.load(spec).model
    return model


class Predictor(Model):  # type: ignore[misc]
    def __init__(self, name: str, behaviour: str, auth_log: Path) -> None:
        super().__init__(name)
        self.behaviour, self.auth_log, self.calls = behaviour, auth_log, 0
        self.net = mlp()
        self.ready = True

    def predict(
        self, payload: Any, headers: dict[str, str] | None = None, response_headers: Any = None
    ) -> Any:
        self.calls += 1
        with self.auth_log.open("a") as f:
            f.write(f"{(headers or {}).get('authorization', '')}\n")
        if self.behaviour == "500" or (self.behaviour == "flaky" and self.calls % 2):
            raise RuntimeError("the predictor broke")
        if self.behaviour == "slow":
            time.sleep(2.0)
        v2 = isinstance(payload, InferRequest)
        x = payload.inputs[0].as_numpy() if v2 else np.asarray(payload["instances"])
        with torch.no_grad():
            out = self.net(torch.as_tensor(x, dtype=torch.float32)).numpy()
        if self.behaviour == "shape":
            out = out[:, :1]
        if v2:
            output = InferOutput("scores", list(out.shape), "FP32", out.astype(np.float32))
            return InferResponse(payload.id or "0", self.name, [output])
        return {"predictions": out.tolist()}


def main() -> None:
    port, auth_log = int(sys.argv[1]), Path(sys.argv[2])
    models = [
        Predictor(name, behaviour, auth_log)
        for name, behaviour in (
            ("mlp", "right"),
            ("mlp-flaky", "flaky"),
            ("mlp-500", "500"),
            ("mlp-shape", "shape"),
            ("mlp-slow", "slow"),
        )
    ]
    ModelServer(http_port=port, enable_grpc=False, workers=1).start(models)


if __name__ == "__main__":
    main()
