"""A worker's set-up of its models, in-process: ``compile = true`` (compiled attributions equal
eager ones; failures fall back to eager and say why) and the device check's defaults and
figures. The HTTP side is in test_export_verify_http.py."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

import methods
import model_registry
from methods import registry
from model_registry.spec import LoadedModel, ModelSpec
from service import kinds
from service.attributions.serving import build_work
from service.core.settings import Settings
from service.kinds import prepare, runtime
from service.wire.attributions import AttributionRequest

X = torch.linspace(-1, 1, 40).reshape(5, 8)


def tabular(**changes: Any) -> ModelSpec:
    spec = {s.id: s for s in model_registry.builtin_specs()}["tabular-mlp"]
    if "dtype" in changes:  # as models.toml does: the float inputs follow the model's dtype
        changes["inputs"] = tuple(replace(i, dtype=changes["dtype"]) for i in spec.inputs)
    return replace(spec, **changes)


def answer(lm: LoadedModel, **body: Any) -> Any:
    req = AttributionRequest.model_validate({"inputs": X.tolist(), "target": 2, **body})
    work = build_work(Settings(), lm.spec, req, time.time() + 60)
    reply = kinds.run(lm, work)
    return reply


@pytest.fixture(scope="module")
def compiled() -> tuple[LoadedModel, dict[str, Any]]:
    lm = model_registry.load(tabular(compile=True, verify_device=True))
    return lm, prepare.prepare(lm)


def test_compiled_attributions_equal_eager_ones(
    compiled: tuple[LoadedModel, dict[str, Any]],
) -> None:
    lm, info = compiled
    assert info["compiled"] is True and info["compile_error"] is None
    assert info["compile_ms"] > 0  # what the compiled calls must win back, reported
    eager = model_registry.load(tabular())
    for method, params in [
        ("saliency", {}),
        ("integrated_gradients", {"n_steps": 20}),
        ("input_x_gradient", {}),
        ("feature_ablation", {}),
    ]:
        assert runtime.serving_model(lm, registry.get(method)) is lm.extra["compiled"]
        got = answer(lm, method=method, params=params).attributions[0]
        want = methods.attribute(eager.model, X, method, target=2, **params).attributions
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-5, atol=1e-6)


def test_hook_methods_keep_the_eager_module(compiled: tuple[LoadedModel, dict[str, Any]]) -> None:
    lm, _ = compiled
    for method in ("deeplift", "layer_integrated_gradients", "neuron_gradient", "lrp"):
        assert runtime.serving_model(lm, registry.get(method)) is lm.model
    reply = answer(lm, method="deeplift")
    want = methods.attribute(lm.model, X, "deeplift", target=2).attributions
    torch.testing.assert_close(torch.from_numpy(reply.attributions[0]), want)


def test_the_device_check_runs_on_the_compiled_path(
    compiled: tuple[LoadedModel, dict[str, Any]],
) -> None:
    _, info = compiled
    v = info["verification"]
    assert info["not_ready"] is None and v["ok"] is True
    assert v["served"] == "cpu/float32 compiled" and v["max_rel_diff"] < 1e-5


def test_a_failed_compile_falls_back_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no compiler on this machine")

    monkeypatch.setattr(torch, "compile", refuse)
    lm = model_registry.load(tabular(compile=True))
    info = prepare.prepare(lm)
    assert info["compiled"] is False
    assert info["compile_error"] == "RuntimeError: no compiler on this machine"
    assert info["compile_ms"] is None
    reply = answer(lm, method="saliency")
    want = methods.attribute(lm.model, X, "saliency", target=2).attributions
    torch.testing.assert_close(torch.from_numpy(reply.attributions[0]), want)


class BrokenGraph(nn.Module):
    """Stands for a compiled module that fails on a shape it had not seen."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("recompilation failed")


def test_a_compiled_module_that_fails_later_is_dropped_for_eager() -> None:
    lm = model_registry.load(tabular(compile=True))
    lm.extra["compiled"] = BrokenGraph()
    reply = answer(lm, method="integrated_gradients", params={"n_steps": 4})
    assert reply.error is None
    want = methods.attribute(lm.model, X, "integrated_gradients", target=2, n_steps=4)
    torch.testing.assert_close(torch.from_numpy(reply.attributions[0]), want.attributions)
    assert lm.extra["compiled"] is None
    assert "recompilation failed" in lm.extra["compile_error"]


def test_device_check_defaults() -> None:
    assert not prepare.verify_enabled(model_registry.load(tabular()))
    assert prepare.verify_enabled(model_registry.load(tabular(dtype="bfloat16")))
    assert prepare.verify_enabled(model_registry.load(tabular(dtype="float16")))
    assert not prepare.verify_enabled(
        model_registry.load(tabular(dtype="bfloat16", verify_device=False))
    )
    assert prepare.verify_enabled(model_registry.load(tabular(verify_device=True)))


def test_bfloat16_figures_are_the_real_deviation() -> None:
    lm = model_registry.load(tabular(dtype="bfloat16"))
    info = prepare.prepare(lm)
    v = info["verification"]
    assert info["not_ready"] is None and v["ok"] is True
    # the same comparison by hand: the probe's IG in bfloat16 against float64 on the CPU
    xs = prepare.probe_inputs(lm, prepare.PROBE_BATCH)[0]
    served = methods.attribute(lm.model, xs, "integrated_gradients", target=0, n_steps=8)
    ref = methods.attribute(
        runtime.reference(lm), xs.double(), "integrated_gradients", target=0, n_steps=8
    )
    diff = (served.attributions.double() - ref.attributions).abs().max()
    rel = float(diff / ref.attributions.abs().max())
    assert v["methods"]["integrated_gradients"]["max_rel_diff"] == pytest.approx(rel)
    assert rel > 1e-4  # bfloat16 is visibly off, within its tolerance


def test_a_check_that_cannot_run_refuses_only_when_asked_for() -> None:
    lm = model_registry.load(tabular(verify_device=True))
    lm.extra["reference"] = "not a model"  # the reference copy cannot run
    figures, reason = prepare.check_device(lm)
    assert reason is not None and "could not run" in reason and "error" in figures
    lm = model_registry.load(tabular(dtype="bfloat16"))  # on by default: logged, not refused
    lm.extra["reference"] = "not a model"
    figures, reason = prepare.check_device(lm)
    assert reason is None and "error" in figures
