"""Captum 0.9.0's verified oracle values (captum-reference section 4.3) and the axioms."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.errors import InvalidArgumentError
from tests import captum_models as cm

T = torch.tensor


def test_ig_basic_model2_both_rules() -> None:  # oracle 1
    x = (T([3.0]), T([1.0]))
    for approx in ("riemann_right", "gausslegendre"):
        r = methods.attribute(
            cm.BasicModel2(), x, "integrated_gradients", n_steps=500,
            approximation_method=approx, return_convergence_delta=True,
        )  # fmt: skip
        torch.testing.assert_close(r.attributions, (T([1.5]), T([-0.5])), atol=0.05, rtol=0)
        assert float(r.convergence_delta.abs().max()) < 0.05


def test_ig_multilayer_values_and_trapezoid() -> None:  # oracle 2
    x = T([[1.5, 2.0, 1.3], [0.5, 0.1, 2.3], [1.5, 2.0, 1.3]])
    expected = T([[4.5, 6, 3.9], [1.5, 0.3, 6.9], [4.5, 6, 3.9]])
    m = cm.MultiLayer()
    for approx in ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle"):
        a = methods.attribute(m, x, "integrated_gradients", target=0, approximation_method=approx)
        torch.testing.assert_close(a.attributions, expected, atol=1e-4, rtol=1e-4)
    # Captum gives 0.98x here (weights summing to (n-1)/n); the true trapezoid rule is exact.
    trap = methods.attribute(
        m, x, "integrated_gradients", target=0, approximation_method="riemann_trapezoid",
        return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(trap.attributions, expected, atol=1e-4, rtol=1e-4)
    assert float(trap.convergence_delta.abs().max()) < 1e-4
    flat = methods.attribute(m, x, "integrated_gradients", target=0, multiply_by_inputs=False)
    torch.testing.assert_close(flat.attributions, torch.full((3, 3), 3.0), atol=1e-4, rtol=0)


def test_deeplift_oracles() -> None:  # oracles 3, 4, 6
    r = methods.attribute(
        cm.ReLUDeepLiftModel(), (T([[1.0]]), T([[2.0]])), "deeplift",
        baselines=(T([[0.0]]), T([[0.0]])), return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(r.attributions, (T([[2.0]]), T([[1.0]])))
    r = methods.attribute(
        cm.ReLUDeepLiftModel(), (T([[1.0]]), T([[2.0]])), "deeplift", multiply_by_inputs=False
    )
    torch.testing.assert_close(r.attributions, (T([[2.0]]), T([[0.5]])))
    r = methods.attribute(
        cm.LinearMaxPoolLinear(), torch.ones(2, 4), "deeplift", target=0,
        baselines=T([[1.0, 2, 3, 9], [4, 8, 6, 7]]), return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(r.attributions, T([[0.0, 0, 0, -8], [0, -7, 0, 0]]))
    torch.testing.assert_close(r.convergence_delta, torch.zeros(2))
    base = T([[0.0, 0, 0], [1, 1, 1]])
    r = methods.attribute(
        cm.ReLULinearModel(), (T([[-10.0, 1, -5], [2, 3, 4]]), T([[3.0, 3, 1], [2.3, 5, 4]])),
        "deeplift_shap", baselines=(base, base), return_convergence_delta=True,
    )  # fmt: skip
    torch.testing.assert_close(
        r.attributions, (T([[-2.0, 0, 0], [4.5, 2.5, 0]]), T([[5.0, 7.5, 0], [3.6, 13.5, 0]]))
    )
    torch.testing.assert_close(r.convergence_delta, torch.zeros(4), atol=1e-5, rtol=0)


def test_deeplift_functional_basic_model2_is_right() -> None:
    # Captum returns (3, -1) with delta 1.0 here (functional relus get plain gradients).
    r = methods.attribute(
        cm.BasicModel2(), (T([3.0]), T([1.0])), "deeplift", return_convergence_delta=True
    )
    torch.testing.assert_close(r.attributions, (T([1.5]), T([-0.5])))
    assert float(r.convergence_delta.abs().max()) < 1e-6


def test_guided_backprop_and_deconvolution_oracles() -> None:  # oracle 17
    ci = torch.arange(16.0).view(1, 1, 4, 4)
    gbp = methods.attribute(cm.ConvNetOneConv(), ci, "guided_backprop", target=0)
    torch.testing.assert_close(
        gbp.attributions[0, 0], T([[0.0, 1, 1, 1], [1, 3, 3, 2], [1, 3, 3, 2], [1, 2, 2, 1]])
    )
    dec = methods.attribute(cm.ConvNetOneConv(), ci, "deconvolution", target=0)
    torch.testing.assert_close(
        dec.attributions[0, 0], T([[2.0, 3, 3, 1], [3, 5, 5, 2], [3, 5, 5, 2], [1, 2, 2, 1]])
    )


def test_gradient_basics_and_target_forms() -> None:  # oracles 20, 21
    sal = methods.attribute(cm.BasicModel(), T([1.0, 2, 3, 0, -1, 7]), "saliency")
    torch.testing.assert_close(sal.attributions, T([0.0, 0, 0, 1, 1, 0]))
    ixg = methods.attribute(cm.MultiLayer(), T([[20.0, 50, 30]]), "input_x_gradient", target=0)
    torch.testing.assert_close(ixg.attributions, T([[80.0, 200, 120]]))
    s = methods.attribute(cm.MultiLayer(), T([[1.0, -2, 3]]), "saliency", target=1, abs=False)
    torch.testing.assert_close(s.attributions, T([[3.0, 3, 3]]))
    x = T([[1.0, 2, 3], [4, 5, 6]])
    md = dict(additional_forward_args=(None, True), abs=False)
    a = methods.attribute(cm.MultiLayer(), x, "saliency", target=(1, 1, 1), **md)
    torch.testing.assert_close(a.attributions, T([[24.0] * 3, [32.0] * 3]))
    a = methods.attribute(cm.MultiLayer(), x, "saliency", target=[(0, 0, 0), (1, 1, 1)], **md)
    torch.testing.assert_close(a.attributions, T([[3.0] * 3, [32.0] * 3]))
    for t in (T([0, 1]), [0, 1]):
        a = methods.attribute(cm.MultiLayer(), x, "saliency", target=t, abs=False)
        torch.testing.assert_close(a.attributions, T([[3.0] * 3, [4.0] * 3]))
    for t in (T(1), [1, 0]):  # the gradient does not depend on the class here
        a = methods.attribute(cm.MultiLayer(), x, "saliency", target=t, abs=False)
        torch.testing.assert_close(a.attributions, T([[3.0] * 3, [4.0] * 3]))


@pytest.mark.parametrize("name", ["integrated_gradients", "deeplift"])
def test_completeness(name: str) -> None:
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 7), nn.ReLU(), nn.Linear(7, 2))
    m = m.double()
    x, b = torch.randn(6, 5, dtype=torch.float64), torch.randn(1, 5, dtype=torch.float64)
    r = methods.attribute(m, x, name, target=1, baselines=b, return_convergence_delta=True)
    with torch.no_grad():
        gap = m(x)[:, 1] - m(b)[:, 1]
    torch.testing.assert_close(r.attributions.sum(1), gap + r.convergence_delta)
    # IG's quadrature error at the ReLU kinks is small but not zero; DeepLift is exact.
    assert float(r.convergence_delta.abs().max()) < (
        1e-2 if name == "integrated_gradients" else 1e-10
    )


def test_saliency_of_a_linear_model_is_abs_weights() -> None:
    torch.manual_seed(2)
    lin = nn.Linear(6, 3).double()
    x = torch.randn(4, 6, dtype=torch.float64)
    r = methods.attribute(lin, x, "saliency", target=2)
    torch.testing.assert_close(r.attributions, lin.weight[2].abs().expand(4, 6).detach())


def test_ig_auto_steps_meet_the_tolerance() -> None:
    torch.manual_seed(3)
    m = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    for approx, tol in (
        ("gausslegendre", 1e-3), ("riemann_trapezoid", 1e-3), ("riemann_middle", 1e-3),
        ("riemann_left", 1e-2), ("riemann_right", 1e-2), ("clenshaw_curtis", 1e-3),
    ):  # fmt: skip
        r = methods.attribute(
            m, x, "integrated_gradients", n_steps="auto", delta_tolerance=tol,
            approximation_method=approx, return_convergence_delta=True,
        )  # fmt: skip
        with torch.no_grad():
            gap = (m(x) - m(torch.zeros_like(x))).squeeze(1).abs()
        assert r.params["converged"]
        assert bool((r.convergence_delta.abs() <= tol * gap).all())
        # the same number of steps, run directly, gives the same attributions
        direct = methods.attribute(
            m, x, "integrated_gradients", n_steps=r.params["n_steps"], approximation_method=approx
        )
        torch.testing.assert_close(r.attributions, direct.attributions, rtol=1e-9, atol=1e-12)


def test_clenshaw_curtis_is_exact_for_polynomials_and_nested() -> None:
    """n points integrate every polynomial of degree < n exactly (odd n: degree n), the
    weights are positive, and the points of N intervals are among those of 2N."""
    from methods.engine.quadrature import rule

    for n in (2, 3, 5, 9, 17, 33):
        alphas, weights = (torch.tensor(v, dtype=torch.float64) for v in rule("clenshaw_curtis", n))
        assert bool((weights > 0).all())
        for degree in range(n + (n % 2)):
            exact = 1.0 / (degree + 1)
            assert float((weights * alphas**degree).sum()) == pytest.approx(exact, abs=1e-14)
        if n > 2:
            coarse = torch.tensor(rule("clenshaw_curtis", (n - 1) // 2 + 1)[0], dtype=torch.float64)
            torch.testing.assert_close(alphas[::2], coarse, rtol=0, atol=1e-15)


def test_auto_steps_cost_what_they_stop_at() -> None:
    """n_steps="auto" without a rule climbs the nested Clenshaw-Curtis ladder: it evaluates
    exactly the points it stops at (Gauss-Legendre's ladder evaluates every rung anew), and
    its answer is the rule's at that many points."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))
    m = m.double()
    x = torch.rand(3, 1, 6, 6, dtype=torch.float64)
    auto = methods.attribute(m, x, "integrated_gradients", target=1, n_steps="auto",
                             delta_tolerance=1e-3)  # fmt: skip
    assert auto.params["approximation_method"] == "clenshaw_curtis"
    assert auto.params["n_steps_evaluated"] == auto.params["n_steps"] > 5
    direct = methods.attribute(m, x, "integrated_gradients", target=1,
                               n_steps=auto.params["n_steps"],
                               approximation_method="clenshaw_curtis")  # fmt: skip
    torch.testing.assert_close(auto.attributions, direct.attributions, rtol=1e-9, atol=1e-12)
    gl = {"approximation_method": "gausslegendre", "delta_tolerance": 1e-3}
    gauss = methods.attribute(m, x, "integrated_gradients", target=1, n_steps="auto", **gl)
    assert gauss.params["n_steps_evaluated"] > gauss.params["n_steps"]


@pytest.mark.parametrize(("look", "passes"), [(2, 4), (5, 2), (9, 1), (17, 1)])
def test_auto_steps_looking_ahead_give_the_same_answer_in_fewer_passes(
    monkeypatch: pytest.MonkeyPatch, look: int, passes: int
) -> None:
    """Where a pass costs its launches (a GPU), the first pass evaluates a higher rung of the
    nested ladder and the lower rungs are read off its points: the same stopping rung and
    attributions as rung by rung, in fewer passes (here the ladder stops at 9 points)."""
    from methods.gradient import integrated_gradients as ig

    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2)).double()
    x = torch.rand(3, 8, dtype=torch.float64)
    kw: dict[str, Any] = {"target": 1, "n_steps": "auto", "delta_tolerance": 1e-4}
    plain = methods.attribute(m, x, "integrated_gradients", **kw)
    assert plain.params["n_steps"] == plain.params["n_steps_evaluated"] == 9
    calls: list[int] = []
    path = ig.path_gradient_sum

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return path(*args, **kwargs)

    monkeypatch.setattr(ig, "path_gradient_sum", counted)
    monkeypatch.setitem(ig.LOOKAHEAD_POINTS, "cpu", look)
    ahead = methods.attribute(m, x, "integrated_gradients", **kw)
    assert len(calls) == passes
    assert ahead.params["n_steps"] == 9
    assert ahead.params["n_steps_evaluated"] == max(9, look)
    torch.testing.assert_close(ahead.attributions, plain.attributions, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ahead.convergence_delta, plain.convergence_delta)


@pytest.mark.parametrize("rule", [None, "gausslegendre", "riemann_trapezoid"])
def test_auto_steps_say_what_they_took(rule: str | None) -> None:
    """The result's ``steps`` (CONTRACT 8.1): the rung it stopped at, the forward rows per
    example the model actually ran (counted here by a hook: the path's points and the two
    endpoints) and the error estimate; None for a fixed n_steps."""
    torch.manual_seed(4)
    m = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    x = torch.rand(3, 5, dtype=torch.float64)
    rows: list[int] = []
    handle = m.register_forward_hook(lambda _m, args, _o: rows.append(int(args[0].shape[0])))
    kw: dict[str, Any] = {} if rule is None else {"approximation_method": rule}
    try:
        auto = methods.attribute(m, x, "integrated_gradients", target=1, n_steps="auto", **kw)
    finally:
        handle.remove()
    steps = auto.steps
    assert steps is not None and steps["n_steps"] == auto.params["n_steps"]
    assert steps["evaluations"] == sum(rows) / len(x)
    assert steps["error_estimate"] == auto.params["change"] <= auto.params["delta_tolerance"]
    if rule != "gausslegendre":  # nested: each point once
        assert steps["evaluations"] == steps["n_steps"] + 2
    fixed = methods.attribute(m, x, "integrated_gradients", target=1, n_steps=8)
    assert fixed.steps is None


def test_auto_steps_keep_no_more_points_than_the_memory_budget() -> None:
    """Keeping every point's gradient would pass a tiny budget: each rung is computed whole
    instead (as Gauss-Legendre's ladder is), with the same answer."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2)).double()
    x = torch.rand(4, 64, dtype=torch.float64)
    kw: dict[str, Any] = {"target": 1, "n_steps": "auto", "delta_tolerance": 1e-4}
    kept = methods.attribute(m, x, "integrated_gradients", **kw)
    try:
        methods.set_memory_budget(4 * 64 * 8 * 4)  # four points' gradients
        whole = methods.attribute(m, x, "integrated_gradients", **kw)
    finally:
        methods.set_memory_budget(None)  # by device again
    assert whole.params["n_steps"] == kept.params["n_steps"] > 5
    assert kept.params["n_steps_evaluated"] == kept.params["n_steps"]
    assert whole.params["n_steps_evaluated"] > whole.params["n_steps"]
    torch.testing.assert_close(whole.attributions, kept.attributions, rtol=1e-9, atol=1e-12)


def test_layer_ig_auto_steps_stop_where_the_fixed_rule_agrees() -> None:
    """Layer integrated gradients take n_steps="auto" too: the nested ladder on the layer's
    values, stopping on the delta against the model's output, with the answer of the rule at
    the steps it stopped at and within the tolerance of completeness."""
    torch.manual_seed(6)
    m = nn.Sequential(
        nn.Embedding(30, 8), nn.Flatten(), nn.Linear(40, 16), nn.Tanh(), nn.Linear(16, 2)
    ).double()
    ids = torch.randint(1, 30, (3, 5))
    kw: dict[str, Any] = {"layer": "0", "target": 1, "baselines": torch.zeros_like(ids)}
    auto = methods.attribute(m, ids, "layer_integrated_gradients", n_steps="auto",
                             delta_tolerance=1e-4, return_convergence_delta=True, **kw)  # fmt: skip
    steps = auto.params["n_steps"]
    assert auto.params["converged"] and auto.params["n_steps_evaluated"] == steps > 3
    direct = methods.attribute(m, ids, "layer_integrated_gradients", n_steps=steps,
                               approximation_method="clenshaw_curtis",
                               return_convergence_delta=True, **kw)  # fmt: skip
    torch.testing.assert_close(auto.attributions, direct.attributions, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(auto.convergence_delta, direct.convergence_delta)
    with pytest.raises(InvalidArgumentError, match="multiply_by_inputs"):
        methods.attribute(m, ids, "layer_integrated_gradients", n_steps="auto",
                          multiply_by_inputs=False, **kw)  # fmt: skip


class _Stepped(nn.Module):
    """A smooth part and a jump no gradient sees: the delta can never be met."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) + 10.0 * (x[:, :1] > 0.5).to(x.dtype)


def test_auto_steps_stop_when_the_rungs_agree_though_the_delta_cannot_be_met() -> None:
    torch.manual_seed(7)
    m = _Stepped().double()
    x = torch.full((3, 4), 0.9, dtype=torch.float64)
    r = methods.attribute(m, x, "integrated_gradients", target=0, n_steps="auto",
                          delta_tolerance=1e-3)  # fmt: skip
    assert r.params["stopped"] == "stable" and not r.params["converged"]
    assert r.params["change"] <= 1e-4 and r.params["n_steps"] < 513
    # where the delta is met, one more rung still has to agree before it stops
    smooth = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()
    s = methods.attribute(smooth, x, "integrated_gradients", target=0, n_steps="auto",
                          delta_tolerance=1e-3)  # fmt: skip
    assert s.params["stopped"] == "delta" and s.params["converged"]
    assert s.params["change"] <= 1e-3


def test_neuron_ig_auto_steps_meet_completeness_against_the_neuron() -> None:
    """Neuron integrated gradients take n_steps="auto": the attributions sum to the neuron's
    change from the baseline within the tolerance, equal Captum's at many steps, and a
    selector that gives no value per example (an aggregate) is refused by name."""
    from captum.attr import NeuronIntegratedGradients

    torch.manual_seed(8)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    r = methods.attribute(m, x, "neuron_integrated_gradients", layer="1", neuron_selector=3,
                          n_steps="auto", delta_tolerance=1e-4)  # fmt: skip
    assert r.params["converged"] and 3 < r.params["n_steps"] < 513
    with torch.no_grad():
        change = torch.tanh(m[0](x))[:, 3] - torch.tanh(m[0](torch.zeros_like(x)))[:, 3]
    assert float((r.attributions.sum(1) - change).abs().max()) <= 1e-4 * float(change.abs().max())
    theirs = NeuronIntegratedGradients(m, m[1]).attribute(x, neuron_selector=3, n_steps=400)
    torch.testing.assert_close(r.attributions, theirs, rtol=1e-6, atol=1e-8)
    with pytest.raises(InvalidArgumentError, match="one per example"):
        methods.attribute(m, x, "neuron_integrated_gradients", layer="1",
                          neuron_selector=lambda out: out.sum(), n_steps="auto")  # fmt: skip


def test_noise_tunnel_over_ig_takes_auto_steps() -> None:
    """SmoothGrad over integrated gradients with n_steps="auto": the ladder stops when every
    noisy copy has converged, and the answer is the fixed rule's at the steps it stopped at,
    with the same noise."""
    torch.manual_seed(9)
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(3, 4, dtype=torch.float64)
    nt = {"nt_type": "smoothgrad", "nt_samples": 4, "stdevs": 0.1}
    auto = methods.attribute(m, x, "integrated_gradients", target=1, n_steps="auto",
                             noise_tunnel=nt, seed=0, delta_tolerance=1e-4)  # fmt: skip
    assert auto.params["converged"] and auto.params["noise_tunnel"]["nt_samples"] == 4
    fixed = methods.attribute(m, x, "integrated_gradients", target=1, noise_tunnel=nt, seed=0,
                              n_steps=auto.params["n_steps"])  # fmt: skip
    torch.testing.assert_close(auto.attributions, fixed.attributions, rtol=1e-9, atol=1e-12)
