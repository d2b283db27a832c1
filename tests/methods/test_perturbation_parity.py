"""Perturbation methods against Captum 0.9.0: its oracle values (captum-reference §4.3) and
parity in float64 on the model matrix, for several masks, windows, strides and chunkings."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from captum.attr import FeatureAblation, Occlusion, ShapleyValues

import methods
from tests import zoo
from tests.captum_models import BoolInput, ConvNetOneConv, MultiInput, MultiLayer

CASES = [c.name for c in zoo.cases()]
PPES: list[Any] = [1, 3, "auto"]


def _tuple(x: Any) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _close(ours: Any, ref: Any, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Elementwise closeness (atol relative to the largest reference magnitude)."""
    assert isinstance(ours, tuple) == isinstance(ref, tuple)
    for a, b in zip(_tuple(ours), _tuple(ref), strict=True):
        assert a.shape == b.shape, (a.shape, b.shape)
        scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
        torch.testing.assert_close(a, b.to(a.dtype), rtol=rtol, atol=atol * scale)


def _common(c: zoo.Case) -> dict[str, Any]:
    return {"target": c.target, "additional_forward_args": c.additional_forward_args}


def _t(rows: list[list[int]] | list[int]) -> torch.Tensor:
    return torch.tensor(rows)


_HALF = torch.arange(8) // 4
QUADRANTS = (_HALF.view(8, 1) * 2 + _HALF.view(1, 8)).view(1, 1, 8, 8)

#: Grouped masks with at most 4 features (exact Shapley in Captum costs F! x F forwards).
MASKS: dict[str, list[Any]] = {
    "mlp": [_t([[0, 0, 1, 1, 2, 2]]), _t([[0, 1, 2, 0, 1, 2], [2, 2, 1, 1, 0, 0],
                                         [0, 0, 0, 1, 1, 1], [1, 2, 1, 2, 0, 0]])],
    "cnn": [torch.arange(3).view(1, 3, 1, 1),
            QUADRANTS],
    "two_input": [(_t([[0, 0, 1, 1]]), _t([[1, 2, 2]]))],
    "multidim": [_t([[0, 1, 1, 2, 2]])],
    "module_twin": [_t([[0, 0, 1, 2, 3]])],
    "conv_twin": [torch.arange(2).view(1, 2, 1, 1)],
}  # fmt: skip

WINDOWS: dict[str, list[tuple[Any, Any]]] = {
    "mlp": [((2,), None), ((3,), 2), ((6,), 4)],
    "cnn": [((3, 3, 3), (1, 2, 2)), ((1, 4, 4), (1, 4, 4)), ((3, 2, 5), (3, 1, 2))],
    "two_input": [(((2,), (2,)), None), (((3,), (1,)), (2, 1))],
    "multidim": [((2,), None), ((4,), (3,))],
    "module_twin": [((3,), 2)],
    "conv_twin": [((1, 3, 3), (1, 2, 2)), ((2, 6, 6), 1)],
}


@pytest.mark.parametrize("case", CASES)
def test_feature_ablation(case: str) -> None:
    c = zoo.by_name(case)
    for mask in [None, *MASKS[case]]:
        ref = FeatureAblation(c.model).attribute(
            c.inputs, baselines=c.baselines, feature_mask=mask, perturbations_per_eval=4,
            **_common(c),
        )  # fmt: skip
        for ppe in PPES:
            res = methods.attribute(
                c.model, c.inputs, "feature_ablation", baselines=c.baselines, feature_mask=mask,
                perturbations_per_eval=ppe, **_common(c),
            )  # fmt: skip
            _close(res.attributions, ref)
            assert _tuple(res.attributions)[0].dtype == _tuple(ref)[0].dtype


@torch.no_grad()
def _occlusion_reference(c: zoo.Case, windows: Any, strides: Any) -> tuple[torch.Tensor, ...]:
    """Slow and literal: one forward per window, float64 averaging."""
    xs = _tuple(c.inputs)
    wins = windows if isinstance(windows[0], tuple) else (windows,)
    if strides is None:
        strides = (1,) * len(xs)
    elif isinstance(strides, int) or len(xs) == 1:
        strides = (strides,) * len(xs) if isinstance(strides, int) else (strides,)
    bs = c.baselines if isinstance(c.baselines, tuple) else (c.baselines,) * len(xs)
    args = c.additional_forward_args
    args = () if args is None else (args if isinstance(args, tuple) else (args,))
    tgt = methods.api.make_target(c.target, xs[0].shape[0])
    f0 = tgt.select(c.model(*xs, *args))
    out = []
    for i, (x, w, s) in enumerate(zip(xs, wins, strides, strict=True)):
        st = (s,) * len(w) if isinstance(s, int) else s
        total = torch.zeros_like(x)
        count = torch.zeros_like(x[0])
        dims = zip(x.shape[1:], w, st, strict=True)
        ranges = [range(0, -(-(d - wd) // sd) * sd + 1, sd) for d, wd, sd in dims]
        for starts in itertools.product(*ranges):
            box = (slice(None), *(slice(a, a + wd) for a, wd in zip(starts, w, strict=True)))
            pert = list(xs)
            b = 0.0 if bs[i] is None else bs[i]
            xi = x.clone()
            xi[box] = (torch.zeros_like(x) + b)[box]
            pert[i] = xi
            diff = f0 - tgt.select(c.model(*pert, *args))
            total[box] += diff.view(-1, *([1] * (x.dim() - 1)))
            count[box[1:]] += 1
        out.append(total / count)
    return tuple(out)


@pytest.mark.parametrize("case", CASES)
def test_occlusion(case: str) -> None:
    c = zoo.by_name(case)
    for windows, strides in WINDOWS[case]:
        ref = Occlusion(c.model).attribute(
            c.inputs, baselines=c.baselines, sliding_window_shapes=windows, strides=strides,
            perturbations_per_eval=4, **_common(c),
        )  # fmt: skip
        literal = _occlusion_reference(c, windows, strides)
        for ppe in PPES:
            res = methods.attribute(
                c.model, c.inputs, "occlusion", baselines=c.baselines,
                sliding_window_shapes=windows, strides=strides, perturbations_per_eval=ppe,
                **_common(c),
            )  # fmt: skip
            # Captum divides by float32 counts: its float64 answers are rounded to float32.
            _close(res.attributions, ref, rtol=1e-6, atol=1e-6)
            _close(_tuple(res.attributions), literal)


@pytest.mark.parametrize("case", CASES)
def test_shapley_values(case: str) -> None:
    c = zoo.by_name(case)
    for mask in MASKS[case]:
        ref = ShapleyValues(c.model).attribute(
            c.inputs, baselines=c.baselines, feature_mask=mask, perturbations_per_eval=4,
            **_common(c),
        )  # fmt: skip
        for ppe in PPES:
            res = methods.attribute(
                c.model, c.inputs, "shapley_values", baselines=c.baselines, feature_mask=mask,
                perturbations_per_eval=ppe, **_common(c),
            )  # fmt: skip
            # Captum accumulates in float32; ours keeps float64.
            assert _tuple(res.attributions)[0].dtype == torch.float64
            _close(res.attributions, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["feature_ablation", "shapley_values", "occlusion"])
def test_chunking_does_not_change_the_answer(method: str) -> None:
    c = zoo.by_name("two_input")
    kw: dict[str, Any] = {"baselines": c.baselines, **_common(c)}
    if method == "occlusion":
        kw["sliding_window_shapes"] = ((2,), (2,))
    results = [
        methods.attribute(c.model, c.inputs, method, perturbations_per_eval=ppe, **kw)
        for ppe in (1, 2, 5, 100, "auto", None)
    ]
    for r in results[1:]:
        _close(r.attributions, results[0].attributions, rtol=1e-13, atol=1e-14)


def test_untargeted_shapes_follow_captum() -> None:
    c = zoo.by_name("mlp")  # (4, 6) -> (4, 3)
    fa = methods.attribute(c.model, c.inputs, "feature_ablation").attributions
    ref = FeatureAblation(c.model).attribute(c.inputs)
    assert fa.shape == ref.shape == (12, 6)
    _close(fa, ref)
    sv = methods.attribute(c.model, c.inputs, "shapley_values", feature_mask=MASKS["mlp"][0])
    assert sv.attributions.shape == (4, 3, 6)


# ---- oracle cases 7-15 of captum-reference §4.3 -------------------------------------------

X1 = torch.tensor([[20.0, 50.0, 30.0]])
MI = (
    torch.tensor([[23.0, 100.0, 0.0], [20.0, 50.0, 30.0]]),
    torch.tensor([[20.0, 50.0, 30.0], [0.0, 100.0, 0.0]]),
    torch.tensor([[0.0, 100.0, 10.0], [2.0, 10.0, 3.0]]),
)
CI = torch.arange(16.0).view(1, 1, 4, 4)
CI2 = torch.ones(1, 1, 4, 4)


def _eq(ours: Any, expected: Any, atol: float = 1e-4) -> None:
    for a, e in zip(_tuple(ours), _tuple(expected), strict=True):
        torch.testing.assert_close(a.float(), torch.as_tensor(e).float(), rtol=0, atol=atol)


def test_oracle_feature_ablation() -> None:
    net = MultiLayer()
    _eq(methods.attribute(net, X1, "feature_ablation", target=0).attributions, [[80, 200, 120]])
    m = torch.tensor([[0, 0, 1]])
    _eq(methods.attribute(net, X1, "feature_ablation", target=0, feature_mask=m).attributions,
        [[280, 280, 120]])  # fmt: skip
    _eq(methods.attribute(net, X1, "feature_ablation", target=0, feature_mask=m, baselines=4)
        .attributions, [[248, 248, 104]])  # fmt: skip
    summed = methods.attribute(
        lambda t: net(t).sum(),
        torch.tensor([[2.0, 10, 3], [20, 50, 30]]),
        "feature_ablation",
        feature_mask=m,
    ).attributions
    assert summed.shape == (1, 3)
    _eq(summed, [[642, 642, 264]])
    bools = torch.tensor([[True, False, True]])
    _eq(methods.attribute(BoolInput(), bools, "feature_ablation", target=0, feature_mask=m)
        .attributions, [[40, 40, 40]])  # fmt: skip
    _eq(methods.attribute(BoolInput(), bools, "feature_ablation", target=0, feature_mask=m,
                          baselines=True).attributions, [[-40, -40, 0]])  # fmt: skip


@pytest.mark.parametrize("ppe", [1, 2, 3])
def test_oracle_feature_ablation_multi_input(ppe: int) -> None:
    masks = (torch.tensor([[1, 1, 1], [0, 1, 0]]), torch.tensor([[3, 4, 2]]),
             torch.tensor([[5, 6, 7], [5, 5, 5]]))  # fmt: skip
    kw = {"target": 0, "feature_mask": masks, "additional_forward_args": (1,),
          "perturbations_per_eval": ppe}  # fmt: skip
    _eq(
        methods.attribute(MultiInput(), MI, "feature_ablation", **kw).attributions,
        ([[492] * 3, [200] * 3], [[80, 200, 120], [0, 400, 0]], [[0, 400, 40], [60, 60, 60]]),
    )
    _eq(methods.attribute(MultiInput(), MI, "feature_ablation", baselines=(2, 3.0, 4), **kw)
        .attributions, ([[468] * 3, [184, 192, 184]], [[68, 188, 108], [-12, 388, -12]],
                        [[-16, 384, 24], [12, 12, 12]]))  # fmt: skip


def test_oracle_feature_ablation_conv() -> None:
    a, b = methods.attribute(ConvNetOneConv(), (CI, CI2), "feature_ablation", target=0).attributions
    _eq(a, [[[[0, 2, 4, 3], [4, 9, 10, 7], [4, 13, 14, 11], [0, 0, 0, 0]]]])
    _eq(b, [[[[1, 2, 2, 1]] * 3 + [[0, 0, 0, 0]]]])
    a, b = methods.attribute(
        ConvNetOneConv(),
        (CI, CI2),
        "feature_ablation",
        target=0,
        feature_mask=(torch.tensor(0), torch.tensor(1)),
    ).attributions
    _eq(a, 67 * torch.ones(1, 1, 4, 4))
    _eq(b, 13 * torch.ones(1, 1, 4, 4))


def test_oracle_occlusion() -> None:
    a, b = methods.attribute(
        ConvNetOneConv(), (CI, CI2), "occlusion", target=0,
        sliding_window_shapes=((1, 2, 3), (1, 1, 2)), strides=((1, 2, 1), (1, 1, 2)),
    ).attributions  # fmt: skip
    _eq(a, [[[[17] * 4, [17] * 4, [64, 65.5, 65.5, 67], [64, 65.5, 65.5, 67]]]])
    _eq(b, [[[[3] * 4, [3] * 4, [3] * 4, [0] * 4]]])
    net = MultiLayer()
    _eq(methods.attribute(net, X1, "occlusion", target=0, sliding_window_shapes=(2,),
                          baselines=torch.tensor([10.0, 10, 10])).attributions,
        [[200, 220, 240]])  # fmt: skip
    _eq(methods.attribute(net, X1, "occlusion", target=0, sliding_window_shapes=(2,), strides=2)
        .attributions, [[280, 280, 120]])  # fmt: skip
    _eq(methods.attribute(net, X1, "occlusion", target=0, sliding_window_shapes=(1,))
        .attributions, [[80, 200, 120]])  # fmt: skip
    res = methods.attribute(
        MultiInput(), MI, "occlusion", target=0, additional_forward_args=(1,),
        sliding_window_shapes=((3,), (1,), (2,)), strides=(2, 1, 2),
        baselines=(torch.tensor([[1.0, 4, 7], [3, 6, 9]]), 3.0, torch.tensor([[4.0], [6]])),
    ).attributions  # fmt: skip
    _eq(res, ([[444] * 3, [328] * 3], [[68, 188, 108], [-12, 388, -12]],
              [[368, 368, 24], [0, 0, -12]]))  # fmt: skip


def test_oracle_shapley_values() -> None:
    net = MultiLayer()
    _eq(methods.attribute(net, X1, "shapley_values", target=0).attributions,
        [[76.666664, 196.666672, 116.666664]])  # fmt: skip
    _eq(
        methods.attribute(
            net, X1, "shapley_values", target=0, feature_mask=torch.tensor([[0, 0, 1]])
        ).attributions,
        [[275, 275, 115]],
    )
    wide = methods.attribute(lambda t: torch.cat([net(t), torch.ones(t.shape[0], 2)], 1), X1,
                             "shapley_values").attributions  # fmt: skip
    assert wide.shape == (1, 4, 3)
    _eq(wide[0, 2:], torch.zeros(2, 3), atol=0)  # exact zeros for a feature-independent output
    masks = (torch.tensor([[1, 1, 1], [0, 1, 0]]), torch.tensor([[0, 1, 2]]),
             torch.tensor([[0, 1, 2], [0, 0, 0]]))  # fmt: skip
    kw = {"target": 0, "feature_mask": masks, "additional_forward_args": (1,)}
    _eq(methods.attribute(MultiInput(), MI, "shapley_values", **kw).attributions,
        ([[1088.6666] * 3, [255, 595, 255]], [[76.6667, 1088.6666, 156.6667], [255, 595, 0]],
         [[76.6667, 1088.6666, 156.6667], [255, 255, 255]]), atol=1e-3)  # fmt: skip
    _eq(methods.attribute(MultiInput(), MI, "shapley_values", baselines=(2, 3.0, 4), **kw)
        .attributions, ([[1040] * 3, [184, 580, 184]], [[52, 1040, 132], [184, 580, -12]],
                        [[52, 1040, 132], [184, 184, 184]]))  # fmt: skip


def test_oracle_kernel_shap_and_lime() -> None:
    net = MultiLayer()
    ks = methods.attribute(net, X1, "kernel_shap", target=0, n_samples=500, seed=1234,
                           baselines=torch.tensor([[10.0, 20, 10]])).attributions  # fmt: skip
    _eq(ks, [[40, 120, 80]], atol=1e-3)
    ks = methods.attribute(net, X1, "kernel_shap", target=0, n_samples=500, seed=1234).attributions
    _eq(ks, [[76.67, 196.67, 116.67]], atol=1.0)
    kw = {"target": 0, "n_samples": 500, "alpha": 1.0, "kernel_width": 10.0, "seed": 1234}
    _eq(methods.attribute(net, X1, "lime", **kw).attributions, [[73.37, 193.33, 113.33]], atol=1.0)
    m = torch.tensor([[0, 0, 1]])
    _eq(methods.attribute(net, X1, "lime", feature_mask=m, **kw).attributions,
        [[271, 271, 111]], atol=1.0)  # fmt: skip
    coefs = methods.attribute(net, X1, "lime", feature_mask=m, return_input_shape=False, **kw)
    assert coefs.attributions.shape == (1, 2)
    _eq(coefs.attributions, [[271, 111]], atol=1.0)


class _IntSum(torch.nn.Module):
    """Integer (or float) features, weighted and summed in float64."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.tensor([1.0, 2.0], dtype=torch.float64)
        return (x.to(torch.float64) * w).sum(1, keepdim=True)


@pytest.mark.parametrize("baselines", [0.2, torch.tensor([[0.5, 0.25]], dtype=torch.float64)])
def test_integer_inputs_take_a_float_baselines_value(baselines: Any) -> None:
    """CONTRACT §7.7: the perturbed input is promoted to the baseline's dtype (Captum 0.9's
    feature ablation and occlusion), not truncated to the input's integers."""
    m, x = _IntSum(), torch.tensor([[0, 1], [3, 4]])
    want = FeatureAblation(m).attribute(x, baselines=baselines, target=0)
    got = methods.attribute(m, x, "feature_ablation", baselines=baselines, target=0)
    _close(got.attributions, want)
    if not isinstance(baselines, torch.Tensor):
        torch.testing.assert_close(
            got.attributions, torch.tensor([[-0.2, 1.6], [2.8, 7.6]], dtype=torch.float64)
        )
    occ = Occlusion(m).attribute(x, sliding_window_shapes=(1,), baselines=baselines, target=0)
    ours = methods.attribute(
        m, x, "occlusion", sliding_window_shapes=(1,), baselines=baselines, target=0
    )
    _close(ours.attributions, occ, rtol=1e-6, atol=1e-7)  # Captum sums windows in float32
    # Shapley values take the baseline's value too (Captum's ShapleyValues truncates it: the
    # one Captum method that builds its perturbed inputs in the input's dtype)
    sv = methods.attribute(m, x, "shapley_values", baselines=baselines, target=0)
    _close(sv.attributions, want)
    # an integer baseline keeps the input's dtype
    same = methods.attribute(m, x, "feature_ablation", baselines=1, target=0)
    _close(same.attributions, FeatureAblation(m).attribute(x, baselines=1, target=0))
