"""Jobs decode once: the job stored at submission is the validated, decoded one, it comes back
from its file as it went in, and each chunk cut from it equals the job the same request for
those examples alone would give (so chunks need no parsing or validation again)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import model_registry
from service.attributions.serving import build_work
from service.core.settings import Settings
from service.core.work import Attribution
from service.jobs.stored import dumps, loads
from service.pool.split import chunk
from service.wire.attributions import AttributionRequest

SPECS = {s.id: s for s in model_registry.builtin_specs()}
RNG = np.random.default_rng(0)
X = RNG.normal(size=(6, 8)).astype(np.float32)

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "per-example targets and baselines": (
        "tabular-mlp",
        {
            "method": "integrated_gradients",
            "inputs": X.tolist(),
            "target": [0, 1, 2, 0, 1, 2],
            "baselines": (X * 0.5).tolist(),
            "params": {"n_steps": 7},
            "return_convergence_delta": True,
        },
    ),
    "a per-example feature mask and one broadcast baseline": (
        "tabular-mlp",
        {
            "method": "feature_ablation",
            "inputs": X.tolist(),
            "target": 1,
            "baselines": [[0.25] * 8],
            "params": {"feature_mask": np.tile(np.arange(8) // 2, (6, 1)).tolist()},
        },
    ),
    "a noise tunnel with a seed": (
        "tabular-mlp",
        {
            "method": "saliency",
            "inputs": X.tolist(),
            "target": "predicted",
            "noise_tunnel": {"nt_type": "smoothgrad", "nt_samples": 3},
            "seed": 11,
        },
    ),
    "a feature mask without the batch dim, as long as the batch": (
        "tabular-mlp",
        {
            "method": "feature_ablation",
            "inputs": np.concatenate([X, X[:2]]).tolist(),  # 8 examples, 8 features
            "target": 0,
            "params": {"feature_mask": [0, 0, 1, 1, 2, 2, 3, 3]},
        },
    ),
    "an image mask whose channels equal the batch": (
        "image-cnn",
        {
            "method": "feature_ablation",
            "inputs": RNG.random((3, 3, 32, 32)).astype(np.float32).tolist(),
            "target": 1,
            "params": {"feature_mask": (np.arange(3 * 32 * 32) // 256).reshape(3, 32, 32).tolist()},
        },
    ),
    "a baseline distribution with as many rows as examples": (
        "tabular-mlp",
        {
            "method": "gradient_shap",
            "inputs": X.tolist(),
            "target": 2,
            "baselines": RNG.normal(size=(6, 8)).astype(np.float32).tolist(),
            "seed": 3,
        },
    ),
    "raw texts on a token model": (
        "text-classifier",
        {
            "method": "integrated_gradients",
            "inputs": ["a wonderful film", "awful", "the plot was great", "dull", "ok", "fine"],
            "target": "positive",
        },
    ),
}


def _job(model: str, body: dict[str, Any]) -> Attribution:
    req = AttributionRequest.model_validate(body)
    return build_work(Settings(), SPECS[model], req, math.inf)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and (a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b)))
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


FIELDS = ("arrays", "texts", "target", "baselines", "params", "noise_tunnel", "seed", "n",
          "method", "internal_batch_size", "perturbations_per_eval", "return_delta",
          "attributed_layer", "post_abs", "max_tokens")  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stored_job_comes_back_as_it_went_in(case: str) -> None:
    work = _job(*CASES[case])
    back, model = loads(dumps(work, "the model's fingerprint"))
    assert model == "the model's fingerprint"
    for name in FIELDS:
        assert _same(getattr(back, name), getattr(work, name)), name


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_chunk_is_the_job_of_its_examples(case: str, where: str) -> None:
    model, body = CASES[case]
    n = len(body["inputs"])
    start, stop = {"first": (0, 2), "middle": (1, n - 1), "last": (n - 1, n)}[where]
    part = chunk(loads(dumps(_job(model, body)))[0], start, stop)
    alone = dict(body)
    alone["inputs"] = body["inputs"][start:stop]
    ndim = np.ndim(body["inputs"]) if not isinstance(body["inputs"][0], str) else 2
    if isinstance(body.get("target"), list):
        alone["target"] = body["target"][start:stop]
    baselines = body.get("baselines")
    distribution = body["method"] == "gradient_shap"  # sampled from, never cut
    per_example = isinstance(baselines, list) and len(baselines) == len(body["inputs"])
    if per_example and np.ndim(baselines) == ndim and not distribution:
        alone["baselines"] = baselines[start:stop]
    mask = body.get("params", {}).get("feature_mask")
    if mask is not None and np.ndim(mask) == ndim and len(mask) == len(body["inputs"]):
        alone["params"] = {**body["params"], "feature_mask": mask[start:stop]}
    want = _job(model, alone)
    for name in FIELDS:
        assert _same(getattr(part, name), getattr(want, name)), name
    assert part.key is None  # a job's chunks never merge with other work
