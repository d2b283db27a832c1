"""precision: the model in a low dtype, the engine's sums in float32, the cost reported."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import methods
from methods.engine import hooks, precision
from methods.errors import InvalidArgumentError, InvalidTypeError, UnsupportedModelError


def mlp() -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 3)]
    return nn.Sequential(*layers).eval()


class Shifted(nn.Module):
    """f(x) = w.(x + 256) - 256 sum(w): exact in float32, x rounded to 2s in bfloat16."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 2, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.linspace(-1, 1, 16).reshape(2, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x + 256.0) - self.lin(torch.full_like(x, 256.0))


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.emb = nn.Embedding(50, 16)
        self.enc = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
        self.head = nn.Linear(16, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(ids)).mean(1))


def test_bfloat16_runs_the_model_in_bfloat16_and_answers_float32() -> None:
    model, x = mlp(), torch.rand(4, 16)
    seen: list[torch.dtype] = []
    r = methods.attribute(model, x, "integrated_gradients", target=1, n_steps=16,
                          precision="bfloat16", verify=True)  # fmt: skip
    ref = methods.attribute(model, x, "integrated_gradients", target=1, n_steps=16)
    assert r.attributions.dtype == torch.float32
    f = r.fidelity
    assert f.precision == "bfloat16" and f.checked and not f.fallback and f.tried is None
    assert f.rel_l2 == pytest.approx(precision.compare(r.attributions, ref.attributions)[0])
    assert 0 < f.rel_l2 < 0.05 and f.topk_agreement >= 0.9
    assert f.delta_ratio is not None and len(f.delta_ratio) == len(r.attributions)
    # the copy really ran in bfloat16
    copy = precision.twin(model, torch.bfloat16)
    copy[0].register_forward_hook(lambda m, a, o: seen.append(o.dtype))
    methods.attribute(model, x, "saliency", target=0, precision="bfloat16")
    assert seen == [torch.bfloat16]
    # the caller's model is as it was
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    assert not model[0]._forward_hooks


def test_the_copy_is_made_once_and_again_when_the_weights_change() -> None:
    model = mlp()
    a = precision.twin(model, torch.bfloat16)
    assert precision.twin(model, torch.bfloat16) is a
    with torch.no_grad():
        model[0].weight.add_(1.0)
    b = precision.twin(model, torch.bfloat16)
    assert b is not a
    assert torch.equal(b[0].weight, model[0].weight.to(torch.bfloat16))


def test_the_copy_follows_the_models_modes_and_keeps_its_ties() -> None:
    """A copy made in training mode is made again after eval() (it kept its dropout); tied
    parameters stay one parameter, cast once, never copied in full precision first."""
    model = nn.Sequential(nn.Embedding(10, 4), nn.Dropout(0.5), nn.Linear(4, 10, bias=False))
    model[2].weight = model[0].weight  # tied, as a language model's head and embedding
    model.train()
    assert precision.twin(model, torch.bfloat16).training
    model.eval()
    copy = precision.twin(model, torch.bfloat16)
    assert not any(m.training for m in copy.modules())
    assert copy[2].weight is copy[0].weight and copy[0].weight.dtype == torch.bfloat16
    assert torch.equal(copy[0].weight, model[0].weight.to(torch.bfloat16))
    assert model[0].weight.dtype == torch.float32


def test_a_copy_made_meanwhile_leaves_out_the_hooks_another_call_holds() -> None:
    """Another call's layer tap on the model while the copy is made (another thread) is not
    copied: it would fire into a call that has ended. The caller's own hooks are copied."""
    model = mlp()
    seen: list[str] = []
    model[0].register_forward_hook(lambda m, a, o: seen.append("own"))
    engine = hooks.hold(model[2].register_forward_hook, lambda m, a, o: seen.append("engine"))
    try:
        copy = precision.twin(model, torch.bfloat16)
    finally:
        engine.remove()
    assert not copy[2]._forward_hooks and len(copy[0]._forward_hooks) == 1
    copy(torch.rand(1, 16, dtype=torch.bfloat16))
    assert seen == ["own"]
    assert not model[2]._forward_hooks


def test_the_probe_lets_go_of_the_copies_it_did_not_keep() -> None:
    model = mlp()
    precision.twin(model, torch.bfloat16)
    precision.twin(model, torch.float16)
    precision.forget(model, keep=torch.float16)
    assert set(precision._TWINS[model]) == {torch.float16}
    precision.forget(model)
    assert not precision._TWINS[model]


def test_an_answer_out_of_tolerance_is_replaced_by_float32() -> None:
    model, x = Shifted(), torch.rand(3, 8)
    ref = methods.attribute(model, x, "feature_ablation", target=1)
    low = methods.attribute(model, x, "feature_ablation", target=1, precision="bfloat16")
    assert low.fidelity.rel_l2 is None and not low.fidelity.checked  # reported as computed
    assert precision.compare(low.attributions, ref.attributions)[0] > 0.05
    r = methods.attribute(model, x, "feature_ablation", target=1, precision="bfloat16",
                          verify=True)  # fmt: skip
    f = r.fidelity
    assert f.fallback and f.rel_l2 > 0.05 and f.precision == "float32" and f.tried == "bfloat16"
    torch.testing.assert_close(r.attributions, ref.attributions)


def test_the_tolerance_is_the_caller_s() -> None:
    model, x = Shifted(), torch.rand(3, 8)
    kept = methods.attribute(model, x, "feature_ablation", target=1, precision="bfloat16",
                             verify=True, fidelity_tolerance=10.0)  # fmt: skip
    f = kept.fidelity
    assert f.checked and not f.fallback and f.precision == "bfloat16" and f.tolerance == 10.0
    for bad in (0, -1.0, float("nan"), True, "0.1"):
        with pytest.raises(InvalidArgumentError):
            methods.attribute(model, x, "feature_ablation", target=1, precision="bfloat16",
                              fidelity_tolerance=bad)  # fmt: skip


def test_every_answer_says_its_precision() -> None:
    """Without a precision: the model's own, nothing checked, the delta ratio per example
    whether or not the delta itself was asked for."""
    model, x = Shifted(), torch.rand(3, 8)
    asked = methods.attribute(model, x, "integrated_gradients", target=1,
                              return_convergence_delta=True)  # fmt: skip
    r = methods.attribute(model, x, "integrated_gradients", target=1)
    assert r.convergence_delta is None and asked.convergence_delta is not None
    f = r.fidelity
    assert f.precision == "float32" and not f.checked and not f.fallback and f.rel_l2 is None
    assert f.delta_ratio is not None and len(f.delta_ratio) == 3
    assert f.delta_ratio == asked.fidelity.delta_ratio
    torch.testing.assert_close(r.attributions, asked.attributions, rtol=0, atol=0)
    assert methods.attribute(model, x, "saliency", target=1).fidelity.delta_ratio is None


def test_layer_methods_sum_in_float32_on_token_models() -> None:
    model, ids = Tokens().eval(), torch.randint(1, 50, (2, 7))
    kw = dict(layer="emb", target=1, n_steps=20, baselines=torch.zeros_like(ids))
    ref = methods.attribute(model, ids, "layer_integrated_gradients", **kw,
                            return_convergence_delta=True)  # fmt: skip
    r = methods.attribute(model, ids, "layer_integrated_gradients", **kw, precision="bfloat16",
                          verify=True, return_convergence_delta=True)  # fmt: skip
    assert r.attributions.dtype == torch.float32 == r.convergence_delta.dtype
    assert r.fidelity.rel_l2 < 0.05
    assert r.attributions.shape == ref.attributions.shape
    # a read tap (gradient x activation) still gets its gradient through the float32 values
    g = methods.attribute(model, ids, "layer_gradient_x_activation", layer="enc", target=0,
                          precision="bfloat16", verify=True)  # fmt: skip
    assert g.fidelity.rel_l2 < 0.05


def test_the_check_compares_what_the_view_makes_of_the_attributions() -> None:
    """``fidelity_view``: a token model's answer is one score per token, and its check
    compares those (CONTRACT 8.1), not the embedding dims."""
    model, ids = Tokens().eval(), torch.randint(1, 50, (2, 7))
    kw = dict(layer="emb", target=1, n_steps=20, baselines=torch.zeros_like(ids))
    ref = methods.attribute(model, ids, "layer_integrated_gradients", **kw).attributions.sum(-1)
    r = methods.attribute(model, ids, "layer_integrated_gradients", **kw, precision="bfloat16",
                          verify=True, fidelity_view=lambda a: a.sum(-1))  # fmt: skip
    got = r.attributions.sum(-1)
    worst = max(float((g - w).norm() / w.norm()) for g, w in zip(got, ref, strict=True))
    assert r.fidelity.rel_l2 == pytest.approx(worst, rel=1e-6)
    assert r.fidelity.top_k == 7  # the tokens, not 7 x 16 dims
    with pytest.raises(InvalidTypeError, match="fidelity_view") as e:
        methods.attribute(model, ids, "layer_integrated_gradients", **kw, precision="bfloat16",
                          fidelity_view="sum")  # fmt: skip
    assert e.value.argument == "fidelity_view"


def test_auto_measures_once_and_keeps_its_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "candidates", lambda device: ["bfloat16"])
    model, x = mlp(), torch.rand(2, 16)
    first = methods.attribute(model, x, "saliency", target=0, precision="auto")
    f = first.fidelity
    assert f.checked and f.chosen.startswith(f"kept {f.precision}") and "bfloat16" in f.chosen
    second = methods.attribute(model, torch.rand(5, 16), "saliency", target=0, precision="auto")
    assert second.fidelity.precision == f.precision and second.fidelity.chosen == f.chosen
    assert not second.fidelity.checked


def test_auto_tries_bfloat16_on_a_cpu_only_where_it_has_bfloat16_units() -> None:
    has = precision.cpu_has_bfloat16()
    assert precision.candidates(torch.device("cpu")) == (["bfloat16"] if has else [])
    model = mlp()
    r = methods.attribute(model, torch.rand(2, 16), "saliency", target=0, precision="auto")
    if not has:
        assert r.fidelity.precision == "float32"
        assert r.fidelity.chosen == "kept float32 (no lower precision to try)"


def test_stochastic_methods_draw_the_same_samples_in_both_precisions() -> None:
    model, x = mlp(), torch.rand(2, 16)
    r = methods.attribute(model, x, "gradient_shap", baselines=torch.zeros(4, 16), target=0,
                          n_samples=8, precision="bfloat16", verify=True)  # fmt: skip
    assert r.fidelity.rel_l2 < 0.05


def test_float32_on_a_bfloat16_model() -> None:
    model = mlp().to(torch.bfloat16)
    x = torch.rand(2, 16)
    r = methods.attribute(model, x, "saliency", target=0, precision="float32")
    exact = methods.attribute(model.float(), x, "saliency", target=0)
    torch.testing.assert_close(r.attributions, exact.attributions)


def test_bad_precision_values_are_named() -> None:
    with pytest.raises(InvalidArgumentError, match="precision must be one of") as e:
        methods.attribute(mlp(), torch.rand(1, 16), "saliency", target=0, precision="fp8")
    assert e.value.argument == "precision"
    with pytest.raises(UnsupportedModelError, match=r"nn\.Module") as e:
        methods.attribute(lambda x: x.sum(1), torch.rand(1, 16), "saliency",
                          precision="bfloat16")  # fmt: skip
    assert e.value.argument == "precision"


class Encoder(nn.Module):
    """Two GELU encoder layers of width 64: float32's ladder stops at 9 points."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.emb = nn.Embedding(50, 64)
        layer = nn.TransformerEncoderLayer(64, 2, 128, dropout=0.0, activation="gelu",
                                           batch_first=True)  # fmt: skip
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(64, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(ids)).mean(1))


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_auto_steps_in_low_precision_stop_where_float32_does(low: str) -> None:
    """n_steps="auto" on a model computing in a low precision: the rungs cannot agree closer
    than its epsilon, nor the delta than its rounding, so it stops by the rung after the one
    where float32 stops, not at the ladder's top (bfloat16 climbed to 65 points here), and the
    answer is float32's within the precision."""
    torch.manual_seed(3)
    model, ids = Encoder().eval(), torch.randint(1, 50, (2, 24))
    kw = {"layer": "emb", "baselines": 0, "target": 1, "n_steps": "auto"}
    ref = methods.attribute(model, ids, "layer_integrated_gradients", **kw)
    r = methods.attribute(model, ids, "layer_integrated_gradients", precision=low, verify=True,
                          **kw)  # fmt: skip
    assert ref.params["converged"] and r.params["converged"]
    # at most one rung of the nested ladder (n -> 2n - 1) past float32's
    assert r.params["n_steps_evaluated"] <= 2 * ref.params["n_steps_evaluated"] - 1
    assert not r.fidelity.fallback and r.fidelity.rel_l2 < 0.05


def test_the_probe_times_float32_warm_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold first call (a model's first forward: kernels, caches) is not float32's speed:
    timed cold, a slower bfloat16 looked 1.8x faster on tiny-lm and was kept."""
    monkeypatch.setattr(precision, "candidates", lambda device: ["bfloat16"])
    calls: list[str] = []

    def run(p: str) -> SimpleNamespace:
        calls.append(p)
        cold = p == "float32" and calls.count("float32") == 1
        time.sleep(0.3 if cold else 0.01 if p == "float32" else 0.05)
        return SimpleNamespace(attributions=torch.ones(1, 4))

    found, _ = precision.probe(mlp(), ("k",), torch.device("cpu"), run)
    assert found.precision == "float32" and found.seconds["float32"] < 0.05
    assert calls == ["float32", "float32", "bfloat16", "bfloat16"]
