"""A real KServe predictor for the remote-model tests: ``python -m tests.service.remote.predictor
PORT AUTH_LOG``. It hosts the built-in tabular MLP (the same weights attrserve builds) under several
names, each behaving as a predictor in trouble does:

- ``mlp``: answers right (V1 ``instances`` and V2 ``inputs``);
- ``mlp-flaky``: answers 500 to every other call (a retry gets through);
- ``mlp-500``: always 500; ``mlp-shape``: one score per instance, not three;
- ``mlp-slow``: answers right after 2 s;
- ``cnn``: the built-in image CNN (3x32x32 images); ``forest``: a scikit-learn random forest
  (``predict_proba``), which no gradient reaches;
- ``text``: the built-in text classifier, sent texts (strings, or ``{"text": ...}``), which
  it tokenizes itself; ``cnn-png``: the image CNN, sent base64 PNG files (strings or
  ``{"b64": ...}``), which it decodes to 0..1 pixels itself.

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


def builtin(name: str) -> torch.nn.Module:
    spec = next(s for s in model_registry.builtin_specs() if s.id == name)
    model: torch.nn.Module = model_registry.load(spec).model
    return model


def mlp() -> torch.nn.Module:
    return builtin("tabular-mlp")


def cnn() -> torch.nn.Module:
    return builtin("image-cnn")


def text() -> torch.nn.Module:
    return builtin("text-classifier")


def decoded(x: Any, behaviour: str) -> Any:
    """What a predictor that takes text or images makes of its instances: token ids, pixels."""
    import base64
    import io

    from PIL import Image

    from model_registry.builtin.text import WordTokenizer

    def value(v: Any) -> str:
        v = v.get("text", v.get("b64")) if isinstance(v, dict) else v
        return v.decode() if isinstance(v, bytes) else str(v)

    values = [value(v) for v in np.asarray(x, dtype=object).reshape(-1)]
    if behaviour == "text":
        ids, _ = WordTokenizer()(values)
        return ids
    pictures = [np.asarray(Image.open(io.BytesIO(base64.b64decode(v)))) for v in values]
    return np.stack(pictures).transpose(0, 3, 1, 2).astype(np.float32) / 255.0


def forest() -> Any:
    """A scikit-learn random forest over 8 features and 3 classes, fit deterministically: a
    model no gradient reaches, as a KServe sklearn predictor serves it."""
    from sklearn.ensemble import RandomForestClassifier

    rng = np.random.RandomState(0)
    x = rng.uniform(-2, 2, size=(300, 8))
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int) + (x[:, 3] > 1).astype(int)
    return RandomForestClassifier(n_estimators=20, max_depth=5, random_state=0).fit(x, y)


class Predictor(Model):  # type: ignore[misc]
    def __init__(self, name: str, behaviour: str, auth_log: Path) -> None:
        super().__init__(name)
        self.behaviour, self.auth_log, self.calls = behaviour, auth_log, 0
        self.net = (
            cnn() if behaviour.startswith("cnn") else text() if behaviour == "text" else mlp()
        )
        self.forest = forest() if behaviour == "sklearn" else None
        self.ready = True

    def get_input_types(self) -> list[dict[str, Any]]:
        """What V2 metadata (``GET /v2/models/{name}``) lists: the tensor models' input."""
        if self.behaviour in ("right", "cnn"):
            shape = [-1, 8] if self.behaviour == "right" else [-1, 3, 32, 32]
            return [{"name": "x", "datatype": "FP32", "shape": shape}]
        return []

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
        x = payload.inputs[0].as_numpy() if v2 else payload["instances"]
        if self.behaviour in ("text", "cnn-png"):
            with torch.no_grad():
                out = self.net(torch.as_tensor(decoded(x, self.behaviour))).numpy()
        elif self.forest is not None:
            out = self.forest.predict_proba(np.asarray(x, dtype=np.float64)).astype(np.float32)
        else:
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
            ("cnn", "cnn"),
            ("forest", "sklearn"),
            ("text", "text"),
            ("cnn-png", "cnn-png"),
        )
    ]
    ModelServer(http_port=port, enable_grpc=False, workers=1).start(models)


if __name__ == "__main__":
    main()
