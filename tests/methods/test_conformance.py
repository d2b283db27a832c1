"""Every registered method, on the model matrix: structure, determinism, batching, hygiene."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import methods
from methods import registry
from tests import zoo
from tests.methods.conformance_args import applicable, kwargs_for

SPECS = registry.specs()
CASES = ["mlp", "cnn", "two_input", "multidim"]


def _params(name: str) -> list[Any]:
    return [
        pytest.param(s, c, id=f"{s.name}-{c}")
        for s in SPECS
        for c in CASES
        if applicable(s, zoo.by_name(c))
    ]


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _snapshot(model: torch.nn.Module) -> dict[str, Any]:
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()},
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "training": [m.training for m in model.modules()],
        "hooks": [
            (len(m._forward_hooks), len(m._forward_pre_hooks), len(m._backward_hooks))
            for m in model.modules()
        ],
    }


def _assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["requires_grad"] == b["requires_grad"]
    assert a["training"] == b["training"]
    assert a["hooks"] == b["hooks"]
    for k in a["state"]:
        assert torch.equal(a["state"][k], b["state"][k]), k


@pytest.mark.parametrize(("spec", "case"), _params("all"))
def test_structure_determinism_and_model_untouched(spec: registry.MethodSpec, case: str) -> None:
    c = zoo.by_name(case)
    kw = kwargs_for(spec, c)
    before = _snapshot(c.model)
    r1 = methods.attribute(c.model, c.inputs, spec.name, seed=7, **kw)
    _assert_same(before, _snapshot(c.model))
    r2 = methods.attribute(c.model, c.inputs, spec.name, seed=7, **kw)
    for a, b in zip(_tuple(r1.attributions), _tuple(r2.attributions), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    if spec.family in ("gradient", "perturbation") and spec.name not in ("guided_gradcam",):
        assert isinstance(r1.attributions, tuple) == isinstance(c.inputs, tuple)
        for a, x in zip(_tuple(r1.attributions), _tuple(c.inputs), strict=True):
            # xrai: one value per pixel, [N, 1, H, W] (the channels' largest)
            want = (1, *x.shape[2:]) if spec.name == "xrai" else x.shape[1:]
            assert a.shape[1:] == want
            assert a.dtype == x.dtype
    assert r1.method == spec.name
    if spec.returns_delta:
        r3 = methods.attribute(
            c.model, c.inputs, spec.name, seed=7, return_convergence_delta=True, **kw
        )
        assert r3.convergence_delta is not None and r3.convergence_delta.dim() == 1


@pytest.mark.parametrize(("spec", "case"), [
    p for p in _params("batch")
    if not p.values[0].stochastic and p.values[0].name != "feature_permutation"
    and p.values[1] in ("mlp", "multidim")
])  # fmt: skip
def test_batch_with_list_target_equals_per_example_runs(
    spec: registry.MethodSpec, case: str
) -> None:
    c = zoo.by_name(case)
    kw = kwargs_for(spec, c)
    x = c.inputs
    assert isinstance(x, torch.Tensor) and isinstance(c.target, list)
    whole = methods.attribute(c.model, x, spec.name, **kw)
    for i in range(x.shape[0]):
        one = dict(kw, target=[c.target[i]])
        if isinstance(kw.get("baselines"), torch.Tensor) and kw["baselines"].shape[0] == x.shape[0]:
            one["baselines"] = kw["baselines"][i : i + 1]
        single = methods.attribute(c.model, x[i : i + 1], spec.name, **one)
        for a, b in zip(_tuple(whole.attributions), _tuple(single.attributions), strict=True):
            torch.testing.assert_close(a[i : i + 1], b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("fail_at", [1, 2])
@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_hooks_and_flags_restored_when_the_model_raises(
    spec: registry.MethodSpec, fail_at: int
) -> None:
    c = zoo.by_name("cnn" if spec.images_only else "mlp")
    kw = kwargs_for(spec, c)

    class Boom(RuntimeError):
        pass

    calls = {"n": 0}

    def explode(module: torch.nn.Module, args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == fail_at:
            raise Boom("bad forward")

    module = c.model.conv2 if spec.images_only else c.model.net[2]
    handle = module.register_forward_pre_hook(explode)
    before = _snapshot(c.model)
    try:
        try:
            methods.attribute(c.model, c.inputs, spec.name, **kw)
        except methods.ModelError as exc:
            assert isinstance(exc.__cause__, Boom)
        else:
            assert calls["n"] < fail_at, "the model raised but the method did not"
        _assert_same(before, _snapshot(c.model))
    finally:
        handle.remove()


def test_available_lists_every_registered_method_with_a_schema() -> None:
    infos = methods.available()
    assert [i.name for i in infos] == [s.name for s in SPECS]
    for info in infos:
        assert info.params.get("type") == "object"
        assert info.kind in ("gradient", "perturbation", "layer", "neuron")
