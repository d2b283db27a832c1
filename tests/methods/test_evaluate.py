"""methods.evaluation.evaluate: Captum parity (infidelity, sensitivity_max, same noise) and
hand-computed deletion/insertion curves on planted models."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest
import torch
from captum.attr import Saliency
from captum.metrics import infidelity as captum_infidelity
from captum.metrics import sensitivity_max as captum_sensitivity_max
from torch import nn

import methods
from methods.errors import BaselineError, InvalidArgumentError, UnknownParameterError
from methods.evaluation import evaluate
from tests import zoo

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _captum_gaussian(seed: int, std: float) -> Callable[[Any], tuple[Any, Any]]:
    """The documented recipe: randn from a generator seeded with ``seed``, input by input."""
    g = _gen(seed)

    def perturb(inputs: Any) -> tuple[Any, Any]:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        noise = tuple(torch.randn(x.shape, generator=g, dtype=x.dtype) * std for x in xs)
        pert = tuple(x - i for x, i in zip(xs, noise, strict=True))
        return (noise, pert) if isinstance(inputs, tuple) else (noise[0], pert[0])

    return perturb


def _captum_uniform(seed: int) -> Callable[[Any, float], Any]:
    g = _gen(seed)

    def perturb(inputs: Any, radius: float) -> Any:
        xs = inputs if isinstance(inputs, tuple) else (inputs,)
        out = tuple(
            x + torch.empty(x.shape, dtype=x.dtype).uniform_(-radius, radius, generator=g)
            for x in xs
        )
        return out if isinstance(inputs, tuple) else out[0]

    return perturb


def _linear(d: int, seed: int = 0, positive: bool = False) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(d, 1).double().eval()
    if positive:
        with torch.no_grad():
            lin.weight.abs_()
    return lin


# ------------------------------------------------------------------------------ infidelity


@pytest.mark.parametrize("case", ["mlp", "two_input"])
def test_infidelity_matches_captum_with_the_same_noise(case: str) -> None:
    c = zoo.by_name(case)
    afa = c.additional_forward_args
    attr = methods.attribute(
        c.model, c.inputs, "saliency", target=c.target, additional_forward_args=afa
    ).attributions
    for normalize in (False, True):
        for rows in (None, 5):
            p: dict[str, Any] = {"noise_std": 0.1, "n_perturb_samples": 4, "normalize": normalize}
            p["max_examples_per_batch"] = rows
            ours = evaluate(
                c.model, c.inputs, attr, target=c.target, metrics={"infidelity": p}, seed=7,
                additional_forward_args=afa,
            )["infidelity"]  # fmt: skip
            ref = captum_infidelity(
                c.model, _captum_gaussian(7, 0.1), c.inputs, attr, target=c.target,
                additional_forward_args=afa, n_perturb_samples=4, max_examples_per_batch=rows,
                normalize=normalize,
            )  # fmt: skip
            assert ours.dtype == F64 and ours.shape == (3 if case == "two_input" else 4,)
            torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)


def test_infidelity_is_zero_for_the_gradient_of_a_linear_model() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(6, 3).double()
    x = torch.randn(5, 6, dtype=F64)
    grad = cast(
        torch.Tensor, methods.attribute(lin, x, "saliency", target=1, abs=False).attributions
    )
    res = evaluate(lin, x, grad, target=1, metrics={"infidelity": {"noise_std": 0.5}}, seed=0)
    assert float(res["infidelity"].abs().max()) <= 1e-20
    bad = evaluate(lin, x, -grad, target=1, metrics={"infidelity": {}}, seed=0)["infidelity"]
    assert float(bad.min()) > 0


def test_seed_fixes_the_noise() -> None:
    c = zoo.by_name("mlp")
    attr = torch.randn(cast(torch.Tensor, c.inputs).shape, dtype=F64)
    m = {"infidelity": {"noise_std": 0.2}}
    a = evaluate(c.model, c.inputs, attr, target=c.target, metrics=m, seed=3)["infidelity"]
    b = evaluate(c.model, c.inputs, attr, target=c.target, metrics=m, seed=3)["infidelity"]
    other = evaluate(c.model, c.inputs, attr, target=c.target, metrics=m, seed=4)["infidelity"]
    assert torch.equal(a, b) and not torch.equal(a, other)
    torch.manual_seed(9)
    g1 = evaluate(c.model, c.inputs, attr, target=c.target, metrics=m)["infidelity"]
    torch.manual_seed(9)
    g2 = evaluate(c.model, c.inputs, attr, target=c.target, metrics=m)["infidelity"]
    assert torch.equal(g1, g2)  # seed=None: torch's global generator


# ------------------------------------------------------------------------- sensitivity_max


def _captum_saliency(model: nn.Module) -> Callable[..., Any]:
    sal = Saliency(model)

    def explain(inputs: Any, **kw: Any) -> Any:
        if isinstance(inputs, tuple):
            return sal.attribute(tuple(x.detach().requires_grad_() for x in inputs), **kw)
        return sal.attribute(inputs.detach().requires_grad_(), **kw)

    return explain


@pytest.mark.parametrize("case", ["mlp", "two_input"])
def test_sensitivity_max_matches_captum_with_the_same_noise(case: str) -> None:
    c = zoo.by_name(case)
    afa = c.additional_forward_args
    attr = methods.attribute(
        c.model, c.inputs, "saliency", target=c.target, additional_forward_args=afa
    ).attributions
    kw: dict[str, Any] = {"target": c.target}
    if afa is not None:
        kw["additional_forward_args"] = afa
    for rows in (None, 5):
        p = {"perturb_radius": 0.3, "n_perturb_samples": 4, "max_examples_per_batch": rows}
        ours = evaluate(
            c.model, c.inputs, attr, target=c.target, metrics={"sensitivity_max": p}, seed=11,
            method="saliency", additional_forward_args=afa,
        )["sensitivity_max"]  # fmt: skip
        ref = captum_sensitivity_max(
            _captum_saliency(c.model), c.inputs, _captum_uniform(11), perturb_radius=0.3,
            n_perturb_samples=4, max_examples_per_batch=rows, **kw,
        )  # fmt: skip
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-14)
        assert float(ours.min()) > 0


def test_sensitivity_max_method_params_and_norm() -> None:
    """With method= and method_params, and with methods.attribute's result in their place
    (CONTRACT 7.3's signature has no method argument): the result carries its method and the
    arguments it was given, and sensitivity_max re-runs exactly that."""
    c = zoo.by_name("mlp")
    p = {"perturb_radius": 0.3, "n_perturb_samples": 3, "norm_ord": 1}
    ours = evaluate(
        c.model, c.inputs, c.inputs, target=c.target, metrics={"sensitivity_max": p}, seed=2,
        method="saliency", method_params={"abs": False},
    )["sensitivity_max"]  # fmt: skip
    res = methods.attribute(c.model, c.inputs, "saliency", target=c.target, abs=False)
    assert res.given == {"abs": False}
    from_result = evaluate(c.model, c.inputs, res, target=c.target,
                           metrics={"sensitivity_max": p}, seed=2)["sensitivity_max"]  # fmt: skip
    sal = _captum_saliency(c.model)
    ref = captum_sensitivity_max(
        lambda x, **kw: sal(x, abs=False, **kw), c.inputs, _captum_uniform(2),
        perturb_radius=0.3, n_perturb_samples=3, norm_ord=1, target=c.target,
    )  # fmt: skip
    for got in (ours, from_result):
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-14)


def test_a_result_s_baselines_and_batch_sizes_come_along() -> None:
    c = zoo.by_name("mlp")
    p = {"perturb_radius": 0.3, "n_perturb_samples": 3, "norm_ord": 1}
    ig = methods.attribute(c.model, c.inputs, "integrated_gradients", target=c.target,
                           baselines=0.5, n_steps=8, internal_batch_size=4)  # fmt: skip
    assert ig.given == {"n_steps": 8, "baselines": 0.5, "internal_batch_size": 4}
    again = evaluate(c.model, c.inputs, ig, target=c.target, metrics={"sensitivity_max": p},
                     seed=2)["sensitivity_max"]  # fmt: skip
    by_hand = evaluate(c.model, c.inputs, ig.attributions, target=c.target, seed=2,
                       metrics={"sensitivity_max": p}, method="integrated_gradients",
                       method_params={"n_steps": 8, "baselines": 0.5,
                                      "internal_batch_size": 4})  # fmt: skip
    torch.testing.assert_close(again, by_hand["sensitivity_max"], rtol=0, atol=0)


def test_sensitivity_of_saliency_of_a_linear_model_is_zero() -> None:
    lin = _linear(5)
    x = torch.randn(4, 5, dtype=F64)
    res = evaluate(
        lin, x, x, target=0, metrics={"sensitivity_max": {"perturb_radius": 1.0}},
        method="saliency", seed=0,
    )  # fmt: skip
    torch.testing.assert_close(res["sensitivity_max"], torch.zeros(4, dtype=F64))


# ---------------------------------------------------------------------- deletion/insertion


@torch.no_grad()
def _hand(
    f: Callable[..., torch.Tensor],
    xs: tuple[torch.Tensor, ...],
    attrs: tuple[torch.Tensor, ...],
    ids: tuple[torch.Tensor, ...],
    bases: tuple[torch.Tensor, ...],
    targets: list[int],
    steps: int,
    insertion: bool,
) -> torch.Tensor:
    """A plain loop over examples and steps; ``ids`` per input (N, ...) shared across inputs."""
    curves = []
    for n in range(xs[0].shape[0]):
        score: dict[int, float] = {}
        for a, i in zip(attrs, ids, strict=True):
            for v, g in zip(a[n].flatten().tolist(), i[n].flatten().tolist(), strict=True):
                score[g] = score.get(g, 0.0) + v
        order = sorted(sorted(score), key=lambda g: -score[g])  # stable: ties in id order
        row = []
        for s in range(steps + 1):
            top = torch.tensor(order[: -(-s * len(order) // steps)], dtype=torch.long)
            mod = []
            for x, b, i in zip(xs, bases, ids, strict=True):
                gone = torch.isin(i[n], top)
                mod.append(
                    torch.where(gone, x[n], b[n]) if insertion else torch.where(gone, b[n], x[n])
                )
            row.append(float(f(*(m[None] for m in mod))[0, targets[n]]))
        curves.append(row)
    return torch.tensor(curves, dtype=F64)


def _auc(curve: torch.Tensor) -> torch.Tensor:
    steps = curve.shape[1] - 1
    return ((curve[:, 1:] + curve[:, :-1]) / 2).sum(1) / steps


def test_curves_match_a_hand_loop_on_a_linear_model() -> None:
    torch.manual_seed(0)
    lin = nn.Linear(6, 3).double().eval()
    x = torch.randn(4, 6, dtype=F64)
    attr = torch.randn(4, 6, dtype=F64)
    attr[0, 2] = attr[0, 4]  # a tie: index order decides
    base = torch.randn(1, 6, dtype=F64)
    targets = [0, 2, 1, 1]
    ids = (torch.arange(6).expand(4, 6),)
    for steps in (4, 6, 9):
        m = {"deletion": {"steps": steps}, "insertion": {"steps": steps}}
        res = evaluate(lin, x, attr, target=targets, metrics=m, baselines=base)
        assert set(res) == {"deletion", "insertion"}
        b = (base.expand(4, 6),)
        for name in ("deletion", "insertion"):
            ref = _hand(lin, (x,), (attr,), ids, b, targets, steps, name == "insertion")
            assert res[name]["curve"].shape == (4, steps + 1)
            torch.testing.assert_close(res[name]["curve"], ref, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(res[name]["auc"], _auc(ref), rtol=1e-12, atol=1e-12)


def test_deletion_is_monotone_and_endpoints_are_input_and_baseline() -> None:
    lin = _linear(8, seed=3, positive=True)
    x = torch.rand(5, 8, dtype=F64) + 0.1
    attr = lin.weight.detach() * x  # exact contributions, all positive
    res = evaluate(lin, x, attr, target=0, metrics={"deletion": {}, "insertion": {}})
    dele, ins = res["deletion"]["curve"], res["insertion"]["curve"]
    assert dele.shape == (5, 21)  # default steps = 20
    fx, f0 = lin(x)[:, 0].detach(), lin(torch.zeros_like(x))[:, 0].detach()
    torch.testing.assert_close(dele[:, 0], fx)
    torch.testing.assert_close(dele[:, -1], f0)
    torch.testing.assert_close(ins[:, 0], f0)
    torch.testing.assert_close(ins[:, -1], fx)
    assert bool((dele.diff(dim=1) <= 1e-12).all()) and bool((ins.diff(dim=1) >= -1e-12).all())
    # the exact ranking deletes the most first: below the reverse ranking's curve
    worse = evaluate(lin, x, -attr, target=0, metrics={"deletion": {}})["deletion"]
    assert bool((res["deletion"]["auc"] < worse["auc"]).all())


def test_feature_mask_groups_rank_by_their_attribution_sum() -> None:
    torch.manual_seed(2)
    lin = nn.Linear(6, 2).double().eval()
    x = torch.randn(3, 6, dtype=F64)
    attr = torch.randn(3, 6, dtype=F64)
    mask = torch.tensor([[5, 5, 1, 1, 9, 3]])  # ids need not be contiguous
    m = {"deletion": {"steps": 4}, "insertion": {"steps": 3}}
    res = evaluate(lin, x, attr, target=1, metrics=m, feature_mask=mask, baselines=0.5)
    b = (torch.full_like(x, 0.5),)
    for name, steps in (("deletion", 4), ("insertion", 3)):
        ref = _hand(
            lin, (x,), (attr,), (mask.expand(3, 6),), b, [1] * 3, steps, name == "insertion"
        )
        torch.testing.assert_close(res[name]["curve"], ref, rtol=1e-12, atol=1e-12)
    # per-example masks with different numbers of groups
    per = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 1, 2, 3, 4, 5], [2, 2, 2, 2, 2, 2]])
    got = evaluate(lin, x, attr, target=1, metrics={"deletion": {"steps": 5}}, feature_mask=per)
    ref = _hand(lin, (x,), (attr,), (per,), (torch.zeros_like(x),), [1] * 3, 5, False)
    torch.testing.assert_close(got["deletion"]["curve"], ref, rtol=1e-12, atol=1e-12)


def test_image_inputs_rank_pixels_over_channels() -> None:
    c = zoo.by_name("cnn")  # (3, 3, 8, 8)
    x = cast(torch.Tensor, c.inputs)
    attr = torch.randn(x.shape, dtype=F64, generator=torch.Generator().manual_seed(0))
    m = {"deletion": {"steps": 7}, "insertion": {"steps": 5}}
    res = evaluate(c.model, x, attr, target=1, metrics=m)
    pix = torch.arange(64).reshape(1, 1, 8, 8)
    explicit = evaluate(c.model, x, attr, target=1, metrics=m, feature_mask=pix)
    b = (torch.zeros_like(x),)
    for name, steps in (("deletion", 7), ("insertion", 5)):
        torch.testing.assert_close(res[name]["curve"], explicit[name]["curve"], rtol=1e-12,
                                   atol=1e-14)  # fmt: skip
        ref = _hand(
            c.model, (x,), (attr,), (pix.expand(x.shape),), b, [1] * 3, steps, name == "insertion"
        )
        torch.testing.assert_close(res[name]["curve"], ref, rtol=1e-12, atol=1e-12)


def test_multi_input_features_are_ranked_jointly() -> None:
    c = zoo.by_name("two_input")  # inputs (3, 4), (3, 3); forward(a, b, scale)
    xs = cast(tuple[torch.Tensor, ...], c.inputs)
    attrs = tuple(torch.randn(x.shape, dtype=F64) for x in xs)
    bases = (0.1, torch.randn(1, 3, dtype=F64))
    m = {"deletion": {"steps": 5}, "insertion": {"steps": 7}}
    res = evaluate(
        c.model, xs, attrs, target=c.target, metrics=m, baselines=bases,
        additional_forward_args=c.additional_forward_args,
    )  # fmt: skip
    ids = (torch.arange(4).expand(3, 4), (torch.arange(3) + 4).expand(3, 3))
    b = (torch.full_like(xs[0], 0.1), bases[1].expand(3, 3))

    def f(a: torch.Tensor, bb: torch.Tensor) -> torch.Tensor:
        return c.model(a, bb, *c.additional_forward_args)

    for name, steps in (("deletion", 5), ("insertion", 7)):
        ref = _hand(f, xs, attrs, ids, b, c.target, steps, name == "insertion")
        torch.testing.assert_close(res[name]["curve"], ref, rtol=1e-12, atol=1e-12)
    # a mask id shared by both inputs is one feature
    masks = (torch.tensor([[0, 1, 1, 2]]), torch.tensor([[2, 0, 3]]))
    got = evaluate(
        c.model, xs, attrs, target=c.target, metrics={"deletion": {"steps": 4}},
        feature_mask=masks, additional_forward_args=c.additional_forward_args,
    )  # fmt: skip
    mids = (masks[0].expand(3, 4), masks[1].expand(3, 3))
    ref = _hand(f, xs, attrs, mids, tuple(torch.zeros_like(x) for x in xs), c.target, 4, False)
    torch.testing.assert_close(got["deletion"]["curve"], ref, rtol=1e-12, atol=1e-12)


def test_chunked_forwards_tensor_args_and_ties() -> None:
    torch.manual_seed(4)

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 3).double()

        def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
            return self.lin(x) * scale[:, None]

    model = Scaled().eval()
    x = torch.randn(4, 5, dtype=F64)
    scale = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=F64)
    attr = torch.ones(4, 5, dtype=F64)  # all tied: deleted in index order
    target = torch.tensor([0, 1, 2, 0])
    m = {"deletion": {"steps": 5}, "insertion": {"steps": 5, "max_examples_per_batch": 3}}
    res = evaluate(model, x, attr, target=target, metrics=m, additional_forward_args=scale)
    # chunks of 3 examples round as chunks do (an AVX-512 CPU's last bit differed)
    torch.testing.assert_close(res["insertion"]["curve"], evaluate(
        model, x, attr, target=target, metrics={"insertion": {"steps": 5}},
        additional_forward_args=scale,
    )["insertion"]["curve"], rtol=1e-12, atol=1e-14)  # fmt: skip
    for n in range(4):
        for s in range(6):
            xm = x[n : n + 1].clone()
            xm[0, :s] = 0
            want = model(xm, scale[n : n + 1])[0, int(target[n])].detach()
            assert float(res["deletion"]["curve"][n, s]) == pytest.approx(float(want), abs=1e-12)


def test_model_is_left_unmodified_and_only_asked_metrics_come_back() -> None:
    c = zoo.by_name("mlp")
    c.model.train()
    before = {k: v.clone() for k, v in c.model.state_dict().items()}
    flags = [p.requires_grad for p in c.model.parameters()]
    res = evaluate(c.model, c.inputs, c.inputs, target=c.target, method="saliency", seed=0)
    assert set(res) == {"infidelity", "sensitivity_max", "deletion", "insertion"}
    assert set(res["deletion"]) == {"auc", "curve"}
    assert c.model.training
    assert [p.requires_grad for p in c.model.parameters()] == flags
    assert all(p.grad is None for p in c.model.parameters())
    after = c.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    no_method = evaluate(c.model, c.inputs, c.inputs, target=c.target, seed=0)
    assert set(no_method) == {"infidelity", "deletion", "insertion"}
    assert set(evaluate(c.model, c.inputs, c.inputs, target=c.target, metrics={})) == set()


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kw", "err", "argument"),
    [
        ({"metrics": {"fidelity": {}}}, UnknownParameterError, "metrics.fidelity"),
        ({"metrics": {"deletion": {"step": 3}}}, UnknownParameterError, "metrics.deletion.step"),
        ({"metrics": {"deletion": {"steps": 0}}}, InvalidArgumentError, "metrics.deletion.steps"),
        (
            {"metrics": {"infidelity": {"noise_std": -1.0}}},
            InvalidArgumentError,
            "metrics.infidelity.noise_std",
        ),
        (
            {"metrics": {"infidelity": {"n_perturb_samples": True}}},
            InvalidArgumentError,
            "metrics.infidelity.n_perturb_samples",
        ),
        ({"metrics": {"insertion": [1]}}, InvalidArgumentError, "metrics.insertion"),
        ({"metrics": {"sensitivity_max": {}}}, InvalidArgumentError, "method"),
        (
            {
                "metrics": {"sensitivity_max": {}},
                "method": "saliency",
                "method_params": {"target": 1},
            },
            InvalidArgumentError,
            "method_params.target",
        ),
        ({"metrics": {"sensitivity_max": {}}, "method": "salency"}, InvalidArgumentError, "method"),
        ({"metrics": {"deletion": {}}, "baselines": torch.zeros(3)}, BaselineError, "baselines"),
        (
            {"metrics": {"deletion": {}}, "feature_mask": torch.zeros(1, 6)},
            InvalidArgumentError,
            "feature_mask",
        ),
        (
            {"metrics": {"deletion": {}}, "feature_mask": torch.zeros(2, 6, dtype=torch.long)},
            InvalidArgumentError,
            "feature_mask",
        ),
    ],
)
def test_bad_arguments_name_the_argument(kw: dict[str, Any], err: type, argument: str) -> None:
    c = zoo.by_name("mlp")
    with pytest.raises(err) as info:
        evaluate(c.model, c.inputs, c.inputs, target=c.target, **kw)
    assert info.value.argument == argument  # type: ignore[attr-defined]


def test_attributions_must_match_the_inputs() -> None:
    c = zoo.by_name("mlp")
    x = cast(torch.Tensor, c.inputs)
    for bad in (x[:, :5], (x, x)):
        with pytest.raises(InvalidArgumentError) as info:
            evaluate(c.model, c.inputs, bad, target=c.target, metrics={"deletion": {}})
        assert info.value.argument == "attributions"
