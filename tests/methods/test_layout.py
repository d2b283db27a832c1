"""Channels-last inputs for conv nets on a CPU (methods.engine.layout): the model sees them
where it can take them, the answers are Captum's and laid out as the caller's inputs, and a
model that cannot take them is run as given."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.errors import ModelError

captum_attr = pytest.importorskip("captum.attr")

CL = torch.channels_last


class _Seen(nn.Module):
    """A small conv net that records the layout of every input it is fed (average pooling:
    a max pooling's gradient would keep gradient methods as given, ``test_ties_*``)."""

    def __init__(self, view: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.pool = nn.AvgPool2d(2)
        self.head = nn.Linear(6 * 4 * 4, 3)
        self.view = view
        self.layouts: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
        h = self.pool(torch.relu(self.conv(x)))
        # a view needs the NCHW layout; flatten copies where it must
        return self.head(h.view(h.shape[0], -1) if self.view else h.flatten(1))


def _net(view: bool = False) -> _Seen:
    torch.manual_seed(0)
    return _Seen(view).eval()


X = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    "method,captum,kw",
    [
        ("integrated_gradients", "IntegratedGradients", {"n_steps": 20}),
        ("saliency", "Saliency", {}),
        ("occlusion", "Occlusion", {"sliding_window_shapes": (3, 2, 2)}),
    ],
)
def test_a_conv_net_is_fed_channels_last_and_answers_as_captum(
    method: str, captum: str, kw: dict[str, Any]
) -> None:
    model = _net()
    res = methods.attribute(model, X, method, target=1, **kw)
    assert model.layouts and all(model.layouts), "the model was fed NCHW"
    want = getattr(captum_attr, captum)(model).attribute(X, target=1, **kw)
    torch.testing.assert_close(res.attributions, want, rtol=1e-5, atol=1e-6)
    assert res.attributions.is_contiguous()


@pytest.mark.parametrize(
    "method,captum,kw",
    [
        ("layer_feature_ablation", "LayerFeatureAblation", {"target": 1}),
        ("neuron_feature_ablation", "NeuronFeatureAblation", {"neuron_selector": (1, 3, 2)}),
    ],
)
def test_feature_ablation_of_a_layer_or_neuron_runs_channels_last(
    method: str, captum: str, kw: dict[str, Any]
) -> None:
    """Their perturbed forwards are their own; the model, and the layers after a swapped-in
    activation, see channels-last all the same."""
    model = _net()
    after: list[bool] = []
    model.pool.register_forward_pre_hook(
        lambda _m, a: after.append(
            a[0].is_contiguous(memory_format=CL) and not a[0].is_contiguous()
        )
    )
    mask = (torch.arange(64).view(1, 1, 8, 8) // 8) if method.startswith("layer") else None
    key = "layer_mask" if mask is not None else "feature_mask"
    res = methods.attribute(model, X, method, layer="conv", **kw, **{key: mask})
    assert model.layouts and all(model.layouts)
    assert all(after) and (bool(after) or method.startswith("neuron"))  # a neuron's stops early
    want = getattr(captum_attr, captum)(model, model.conv).attribute(X, **kw, **{key: mask})
    torch.testing.assert_close(res.attributions, want, rtol=1e-5, atol=1e-6)
    assert res.attributions.is_contiguous()


@pytest.mark.parametrize("method,kw", [("lrp", {}), ("layer_lrp", {"layer": "0"})])
def test_lrp_runs_channels_last_and_answers_as_given(
    method: str, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """LRP's rules wrap the model's forward; the inputs keep their layout through them."""
    from methods.engine import layout

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(96, 3)
    ).eval()
    seen: list[bool] = []
    model[0].register_forward_pre_hook(
        lambda _m, a: seen.append(a[0].is_contiguous(memory_format=CL) and not a[0].is_contiguous())
    )
    res = methods.attribute(model, X, method, target=1, **kw)
    assert seen and all(seen)
    monkeypatch.setattr(layout, "DEVICES", ())
    seen.clear()
    want = methods.attribute(model, X, method, target=1, **kw)
    assert seen and not any(seen)
    torch.testing.assert_close(res.attributions, want.attributions, rtol=1e-5, atol=1e-6)
    assert res.attributions.is_contiguous()


@pytest.mark.parametrize("view", [False, True])
def test_metrics_forwards_run_channels_last_where_the_model_takes_them(
    view: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Infidelity's and the curves' perturbed forwards are their own: a conv net gets them
    channels-last, and one that cannot take them gets them as given, with the same answer
    (unseeded noise included: the try does not move torch's random stream)."""
    from methods.engine import layout
    from methods.evaluation import evaluate

    model = _net(view=view)
    attrs = methods.attribute(model, X, "saliency", target=1).attributions
    metrics: dict[str, Any] = {"infidelity": {}, "deletion": {"steps": 4}, "insertion": {}}
    answers = []
    for devices in (("cpu",), ()):
        monkeypatch.setattr(layout, "DEVICES", devices)
        model.layouts.clear()
        torch.manual_seed(3)
        answers.append(evaluate(model, X, attrs, target=1, metrics=metrics))
        if devices and not view:
            assert model.layouts and all(model.layouts)
        elif devices:
            assert sum(model.layouts) == len(metrics)  # one failed try each, then as given
            model.layouts.clear()
            evaluate(model, X, attrs, target=1, metrics=metrics)
            assert model.layouts and not any(model.layouts)  # not tried again
    for name, got in answers[0].items():
        want = answers[1][name]
        got, want = (got, want) if name == "infidelity" else (got["curve"], want["curve"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("view", [False, True])
def test_attacks_run_channels_last_where_the_model_takes_them(
    view: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FGSM and PGD (random start, unseeded too) on a conv net: channels-last where it
    takes them, the same perturbed inputs as given, a failed try run again from the same
    start."""
    from methods.engine import layout

    model = _net(view=view)
    y = torch.tensor([0, 2])
    pgd = {"radius": 0.3, "step_size": 0.05, "step_num": 3, "random_start": True, "seed": 4,
           "loss": "cross_entropy"}  # fmt: skip
    answers = []
    for devices in (("cpu",), ()):
        monkeypatch.setattr(layout, "DEVICES", devices)
        model.layouts.clear()
        got = [
            methods.attack(model, X, "fgsm", target=y, loss="cross_entropy", epsilon=0.1),
            methods.attack(model, X, "pgd", target=y, **pgd),
        ]
        answers.append(got)
        if devices:
            assert (sum(model.layouts) == 2) if view else all(model.layouts)
    for ours, as_given in zip(*answers, strict=True):
        torch.testing.assert_close(ours.perturbed, as_given.perturbed, rtol=1e-5, atol=1e-6)
        assert ours.perturbed.is_contiguous()
    monkeypatch.setattr(layout, "DEVICES", ("cpu",))
    unseeded = methods.attack(_net(view=view), X, "pgd", target=y, **{**pgd, "seed": None})
    assert ((unseeded.perturbed - X).abs() <= 0.3 + 1e-6).all()


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("perturbation", ["gaussian_noise", "fgsm"])
def test_min_perturbation_runs_channels_last_where_the_model_takes_them(
    view: bool, perturbation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from methods.engine import layout

    model = _net(view=view)
    kw: dict[str, Any] = {"target": 1, "arg_min": 0.0, "arg_max": 4.0, "arg_step": 0.25}
    kw.update({"seed": 0} if perturbation == "gaussian_noise" else {"loss": "cross_entropy"})
    answers = []
    for devices in (("cpu",), ()):
        monkeypatch.setattr(layout, "DEVICES", devices)
        model.layouts.clear()
        answers.append(methods.min_perturbation(model, X, perturbation, **kw))
        if devices:
            assert (sum(model.layouts) == 1) if view else all(model.layouts)
    ours, as_given = answers
    assert ours.min_param == as_given.min_param and any(v is not None for v in ours.min_param)
    torch.testing.assert_close(ours.perturbed, as_given.perturbed, rtol=1e-5, atol=1e-6)


def test_a_layers_attributions_are_laid_out_as_usual() -> None:
    model = _net()
    res = methods.attribute(model, X, "layer_gradcam", target=1, layer="conv")
    want = captum_attr.LayerGradCam(model, model.conv).attribute(X, target=1)
    torch.testing.assert_close(res.attributions, want, rtol=1e-5, atol=1e-6)
    assert res.attributions.is_contiguous()


def test_a_model_that_cannot_take_them_is_run_as_given_and_remembered() -> None:
    model = _net(view=True)
    res = methods.attribute(model, X, "integrated_gradients", target=1, n_steps=8)
    want = captum_attr.IntegratedGradients(model).attribute(X, target=1, n_steps=8)
    torch.testing.assert_close(res.attributions, want, rtol=1e-5, atol=1e-6)
    assert model.layouts[0] and not any(model.layouts[1:])  # one failed try, then NCHW
    model.layouts.clear()
    methods.attribute(model, X, "integrated_gradients", target=1, n_steps=8)
    assert model.layouts and not any(model.layouts)  # not tried again


def test_the_models_own_error_is_still_reported() -> None:
    model = _net()
    with pytest.raises(ModelError, match="mat1 and mat2"):
        methods.attribute(model, torch.randn(2, 3, 10, 10), "saliency", target=1)
    model.layouts.clear()
    methods.attribute(model, X, "saliency", target=1)
    assert model.layouts and all(model.layouts)  # a real error does not turn it off


def test_not_while_a_norm_layer_updates_its_statistics() -> None:
    model = _net()
    model.norm = nn.BatchNorm2d(3)  # registered, in training mode, never called
    methods.attribute(model, X, "saliency", target=1)
    assert model.layouts and not any(model.layouts)
    model.norm.eval()
    model.layouts.clear()
    methods.attribute(model, X, "saliency", target=1)
    assert all(model.layouts)


class _HookView(_Seen):
    """Views the gradient at its conv's output: only the backward fails on channels-last."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
        h = torch.relu(self.conv(x))
        if h.requires_grad:
            h.register_hook(lambda g: g.view(g.shape[0], -1).view(g.shape))
        return self.head(self.pool(h).flatten(1))


def test_a_backward_that_cannot_take_them_is_run_as_given_too() -> None:
    torch.manual_seed(0)
    model = _HookView().eval()
    want = captum_attr.Saliency(model).attribute(X, target=1)
    model.layouts.clear()
    for _ in range(2):
        res = methods.attribute(model, X, "saliency", target=1)
        torch.testing.assert_close(res.attributions, want)
    assert model.layouts[0] and not any(model.layouts[1:])


def test_the_run_as_given_starts_from_the_same_random_state() -> None:
    """Unseeded sampling draws from torch's stream: a failed try must not move it, nor count
    twice on the progress bar."""
    model = _net(view=True)
    answers = []
    for _ in range(2):
        torch.manual_seed(7)
        zeros = torch.zeros(3, 3, 8, 8)
        res = methods.attribute(model, X, "gradient_shap", target=1, baselines=zeros)
        answers.append(res.attributions)
    torch.testing.assert_close(answers[0], answers[1], rtol=0, atol=0)


def test_the_progress_bar_counts_a_run_as_given_once(capsys: pytest.CaptureFixture[str]) -> None:
    import re

    methods.attribute(_net(view=True), X, "integrated_gradients", target=1, n_steps=8,
                      progress=True)  # fmt: skip
    done, total = map(int, re.findall(r"(\d+)/(\d+)", capsys.readouterr().err)[-1])
    assert done == total == 8


def test_the_models_own_error_after_a_failed_try_is_reported_alone() -> None:
    with pytest.raises(methods.errors.TargetError) as caught:
        methods.attribute(_net(view=True), X, "saliency", target=7)
    assert caught.value.__context__ is None


def test_not_while_a_module_with_state_is_in_training_mode() -> None:
    """A training-mode module with buffers (spectral norm's vector, a norm's statistics) may
    move them in a forward: no try that could fail. A wrapper without state may train."""
    model = nn.Sequential(_net()).train()
    model[0].eval()
    methods.attribute(model, X, "saliency", target=1)
    assert all(model[0].layouts)
    sn = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Conv2d(3, 3, 1)), _net()).train()
    sn[1].eval()
    methods.attribute(sn, X, "saliency", target=1)
    assert sn[1].layouts and not any(sn[1].layouts)


def _dropping() -> nn.Sequential:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
        nn.Linear(384, 3),
    ).eval()  # fmt: skip
    model[2].train()
    return model


def test_not_while_dropout_draws_its_masks() -> None:
    """Dropout draws its mask element by element in memory order: channels-last would drop
    other elements than Captum's run for the same seed."""
    model = _dropping()
    seen: list[bool] = []
    model[0].register_forward_pre_hook(lambda _m, a: seen.append(a[0].is_contiguous()))
    torch.manual_seed(5)
    got = methods.attribute(model, X, "saliency", target=1).attributions
    torch.manual_seed(5)
    want = captum_attr.Saliency(model).attribute(X, target=1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.manual_seed(5)
    methods.attack(model, X, "fgsm", target=torch.tensor([0, 2]), loss="cross_entropy", epsilon=0.1)
    assert seen and all(seen)  # fed as given every time


def test_a_cpu_allocation_failure_is_not_blamed_on_the_layout() -> None:
    """On a CPU running out of memory is a plain RuntimeError: reported, not run again as
    given (nor the method refused channels-last from then on)."""

    class Starved(_Seen):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")

    torch.manual_seed(0)
    model = Starved().eval()
    for _ in range(2):
        with pytest.raises(ModelError, match="can't allocate memory"):
            methods.attribute(model, X, "saliency", target=1)
    assert model.layouts == [True, True]


def test_an_attacks_outputs_are_laid_out_as_usual() -> None:
    model = nn.Conv2d(3, 3, 3, padding=1).eval()  # a 4-D output: per-pixel classes
    res = methods.attack(model, X, "fgsm", target=[(0, 1, 1), (2, 3, 3)], epsilon=0.1,
                         loss="cross_entropy")  # fmt: skip
    assert res.predictions.is_contiguous() and res.perturbed.is_contiguous()


# ------------------------------------------------------------------------------ ties (9.1)


class _Pooled(nn.Module):
    """Conv -> ReLU -> a max over windows or channels -> a linear head, the max as a module,
    a functional call, or a reduction."""

    def __init__(self, pool: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.relu = nn.ReLU()  # a module: Captum's DeepLift and guided backprop hook only those
        self.pool = pool
        self.max = nn.MaxPool2d(2) if pool == "module" else None
        self.head = nn.LazyLinear(3)
        self.layouts: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
        # `* 1`: a ReLU feeding a max pooling breaks Captum's DeepLift chain (its
        # tests/methods/test_gradient_parity.py::test_deeplift_adjacent_nonlinearities_chain)
        h = self.relu(self.conv(x)) * 1
        if self.max is not None:
            h = self.max(h)
        elif self.pool == "functional":
            h = torch.nn.functional.max_pool2d(h, 2)
        else:  # a global max per channel
            h = h.amax(dim=(2, 3))
        return self.head(h.flatten(1))


def _pooled(pool: str) -> _Pooled:
    torch.manual_seed(1)
    model = _Pooled(pool).double().eval()
    model(torch.zeros(1, 3, 8, 8, dtype=torch.float64))  # the lazy head takes its shape
    model.layouts.clear()
    return model


XD = torch.randn(3, 3, 8, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
#: a flat background: equal values under a convolution as given
FLAT = XD.clone()
FLAT[:, :, :, 4:] = 0.3


@pytest.mark.parametrize("pool", ["module", "functional", "amax"])
@pytest.mark.parametrize(
    "method,captum,inputs,kw,captum_kw",
    [
        ("deeplift", "DeepLift", XD, {"baselines": 0.1}, {}),  # a constant baseline
        ("input_x_gradient", "InputXGradient", FLAT, {}, {}),
        ("guided_backprop", "GuidedBackprop", FLAT, {}, {}),
        (  # its first step is the baseline
            "integrated_gradients", "IntegratedGradients", XD,
            {"baselines": 0.1, "n_steps": 4, "approximation_method": "riemann_left"},
            {"method": "riemann_left"},
        ),
    ],
)  # fmt: skip
def test_ties_are_broken_as_the_model_as_given_breaks_them(
    pool: str,
    method: str,
    captum: str,
    inputs: torch.Tensor,
    kw: dict[str, Any],
    captum_kw: dict[str, Any],
    both_layouts: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A constant baseline or a flat region gives equal values in a pooling window as given,
    and values a rounding apart channels-last (in an order each CPU's kernels decide: an
    AVX2 EPYC moved DeepLift by 10%). The gradient goes to the window's winner: the answer is
    the NCHW model's, to float64 rounding, on every CPU (``both_layouts`` stands in for one
    that rounds otherwise than this one)."""
    from methods.engine import layout

    model = _pooled(pool)
    got = methods.attribute(model, inputs, method, target=1, **kw).attributions
    assert not any(model.layouts[1:]), "a gradient through a max was fed channels-last"
    with monkeypatch.context() as m:
        m.setattr(layout, "DEVICES", ())
        want = methods.attribute(model, inputs, method, target=1, **kw).attributions
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if method == "deeplift" and pool == "functional":
        return  # Captum's DeepLift hooks modules only: a plain gradient at F.max_pool2d
    ours = {k: v for k, v in kw.items() if k != "approximation_method"}
    want = getattr(captum_attr, captum)(model).attribute(inputs, target=1, **ours, **captum_kw)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_a_model_routing_by_argmax_is_probed_once() -> None:
    """A functional max pooling is seen by a probe on the first gradient run: that run stops
    at the call and is made as given, and the model's gradient work is as given from then on;
    forward-only work keeps the layout."""
    model = _pooled("functional")
    methods.attribute(model, XD, "saliency", target=1)
    assert model.layouts[0] and not any(model.layouts[1:])
    model.layouts.clear()
    methods.attribute(model, XD, "input_x_gradient", target=1)
    assert model.layouts and not any(model.layouts)  # no second try
    model.layouts.clear()
    methods.attribute(model, XD, "occlusion", target=1, sliding_window_shapes=(3, 2, 2))
    assert model.layouts and all(model.layouts)


def test_forward_only_methods_keep_the_layout_on_a_max_pooling_net(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ties move a forward's value by rounding only: occlusion, feature ablation and the
    Shapley family run channels-last over max pooling and equal the run as given."""
    from methods.engine import layout

    model = _pooled("module")
    mask = (torch.arange(64).view(1, 1, 8, 8) // 16).expand(1, 3, 8, 8)
    for method, kw in [
        ("occlusion", {"sliding_window_shapes": (3, 2, 2), "baselines": 0.1}),
        ("feature_ablation", {"feature_mask": mask, "baselines": 0.1}),
        ("shapley_values", {"feature_mask": mask, "baselines": 0.1}),
    ]:
        model.layouts.clear()
        got = methods.attribute(model, FLAT, method, target=1, **kw).attributions
        assert model.layouts and all(model.layouts), method
        with monkeypatch.context() as m:
            m.setattr(layout, "DEVICES", ())
            want = methods.attribute(model, FLAT, method, target=1, **kw).attributions
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


class _Guarded(_Pooled):
    """Max pooling in a try: a model's own ``except Exception`` catches the probe's
    exception and goes on with an average."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.layouts.append(x.is_contiguous(memory_format=CL) and not x.is_contiguous())
        h = self.relu(self.conv(x)) * 1
        try:
            h = torch.nn.functional.max_pool2d(h, 2)
        except Exception:  # what a model may do
            h = torch.nn.functional.avg_pool2d(h, 2)
        return self.head(h.flatten(1))


def test_a_probe_the_model_catches_still_counts() -> None:
    torch.manual_seed(1)
    model = _Guarded("functional").double().eval()
    model(torch.zeros(1, 3, 8, 8, dtype=torch.float64))
    model.layouts.clear()
    got = methods.attribute(model, FLAT, "saliency", target=1, abs=False).attributions
    want = captum_attr.Saliency(model).attribute(FLAT, target=1, abs=False)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert model.layouts[0] and not any(model.layouts[1:])
    methods.attribute(model, FLAT, "saliency", target=1)
    assert not any(model.layouts[1:])  # remembered
