"""methods.tcav: Captum's sign counts for our CAVs, the bounded magnitude, significance on a
planted concept, our logistic regression against scikit-learn's, the t-test against scipy's,
and the typed errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from captum.attr import LayerGradientXActivation
from captum.concept import TCAV, Concept
from captum.concept._utils.classifier import Classifier
from scipy.stats import ttest_ind as scipy_ttest
from sklearn.linear_model import LogisticRegression
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import methods
from methods.concepts.cav import fit_linear, train_cav
from methods.concepts.stats import ttest_ind
from methods.errors import InvalidArgumentError


def _planted() -> nn.Module:
    """Class 1 rises with hidden units 0-3 of the first layer, through a second nonlinear
    layer (so the gradient at a layer varies between inputs); the concept turns them on."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 2)
    ).double()
    with torch.no_grad():
        model[0].weight.normal_(0, 0.6)
        model[0].weight[:4] = 0.0
        model[0].weight[:4, :3] = 1.0
        model[0].bias.zero_()
        model[2].weight.normal_(0, 0.6)
        model[2].bias.normal_(0, 0.3)
        model[2].weight[:6, :4] = 0.8
        model[2].weight[6:, :4] = 0.0
        model[4].weight.normal_(0, 1.0)
        model[4].weight[1, :6] = 1.0
    return model.eval()


def _sets(n_random: int = 8, n: int = 30) -> tuple[dict, dict, torch.Tensor]:
    """A concept set, a noise set drawn like the random sets, the random sets, the inputs."""
    g = torch.Generator().manual_seed(0)
    concept = torch.randn(n, 10, generator=g, dtype=torch.float64) * 0.5
    concept[:, :3] += 2.0
    randoms = {
        f"random{i}": torch.randn(n, 10, generator=g, dtype=torch.float64) for i in range(n_random)
    }
    inputs = torch.randn(40, 10, generator=g, dtype=torch.float64)
    noise = {"noise": torch.randn(n, 10, generator=g, dtype=torch.float64)}
    return {"striped": concept, **noise}, randoms, inputs


class _OurCavs(Classifier):
    """Captum's classifier interface, fitting our CAVs on the activations Captum collects."""

    def __init__(self) -> None:
        self._classes: list[int] = []
        self._w = torch.empty(0)

    def train_and_eval(self, dataloader: DataLoader, **kwargs: object) -> dict:
        xs, ys = zip(*dataloader, strict=True)
        x, y = torch.cat(xs), torch.cat(ys)
        first, second = y.unique_consecutive().tolist()
        cav = train_cav(x[y == first], x[y == second], seed=0)
        self._classes, self._w = [first, second], torch.stack([cav.vector, -cav.vector])
        return {"accs": torch.tensor(cav.accuracy)}

    def weights(self) -> torch.Tensor:
        return self._w

    def classes(self) -> list[int]:
        return self._classes


def _concept(i: int, name: str, x: torch.Tensor) -> Concept:
    return Concept(i, name, DataLoader(TensorDataset(x), batch_size=7))


def test_sign_counts_equal_captums_for_our_cavs(tmp_path) -> None:
    model = _planted()
    concepts, randoms, inputs = _sets(n_random=3)
    layers = ["1", "3"]
    ours = methods.tcav(model, inputs, concepts, layers, target=1, random_concepts=randoms)
    objs = {n: _concept(i, n, x) for i, (n, x) in enumerate({**concepts, **randoms}.items())}
    tcav = TCAV(
        model,
        layers,
        classifier=_OurCavs(),
        layer_attr_method=LayerGradientXActivation(model, None, multiply_by_inputs=False),
        save_path=str(tmp_path),
    )
    sets = [[objs[c], objs[r]] for c in concepts for r in randoms]
    ref = tcav.interpret(inputs, sets, target=1)
    for row in ours.scores:
        for k, r in enumerate(randoms):
            key = f"{objs[row['concept']].id}-{objs[r].id}"
            assert row["sign_counts"][k] == pytest.approx(
                float(ref[key][row["layer"]]["sign_count"][0]), abs=1e-6
            )  # Captum counts in float32; a count differing by one is 1/40 off
        # magnitude: the original library's bounded form, by hand from Captum's gradients
        attr = LayerGradientXActivation(
            model, model.get_submodule(row["layer"]), multiply_by_inputs=False
        )
        g = attr.attribute(inputs, target=1).reshape(len(inputs), -1)
        mags = []
        for cav in ours.cavs[row["concept"]][row["layer"]]:
            s = g @ cav
            mags.append(float(s.clamp_min(0).sum() / s.abs().sum()))
        assert row["magnitude"] == pytest.approx(np.mean(mags), abs=1e-12)
        assert row["sign_count"] == pytest.approx(np.mean(row["sign_counts"]), abs=1e-15)


def test_a_planted_concept_is_significant_and_noise_is_not() -> None:
    model = _planted()
    concepts, randoms, inputs = _sets()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    res = methods.tcav(model, inputs, concepts, ["1", "3"], target=1, random_concepts=randoms)
    rows = {(r["concept"], r["layer"]): r for r in res.scores}
    assert set(rows) == {(c, p) for c in ("striped", "noise") for p in ("1", "3")}
    for layer in ("1", "3"):
        planted, noise = rows["striped", layer], rows["noise", layer]
        assert planted["sign_count"] > 0.95 and planted["magnitude"] > 0.95
        assert planted["significant"] and planted["p_value"] < 0.05
        assert planted["cav_accuracy"] > 0.9
        assert not noise["significant"] and noise["p_value"] > 0.05
        assert len(planted["sign_counts"]) == len(randoms)
    cavs = res.cavs["striped"]["3"]
    assert cavs.shape == (len(randoms), 12)
    torch.testing.assert_close(cavs.norm(dim=1), torch.ones(len(randoms), dtype=torch.float64))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    # repeatable: the held-out examples are picked by the seed (None: 0)
    again = methods.tcav(model, inputs, concepts, ["1", "3"], target=1, random_concepts=randoms)
    assert again.scores == res.scores


def test_the_p_value_is_scipys_pooled_t_test() -> None:
    rng = np.random.default_rng(0)
    for n1 in range(1, 9):
        for n2 in range(1, 80, 7):
            if n1 + n2 < 3:
                continue
            a, b = rng.random(n1).tolist(), (rng.random(n2) + 0.2).tolist()
            t, p = ttest_ind(a, b)
            ref = scipy_ttest(a, b)
            assert p == pytest.approx(float(ref.pvalue), abs=1e-12)
            assert t == pytest.approx(float(ref.statistic), rel=1e-10)
    assert ttest_ind([1.0, 1.0], [0.0, 0.0, 0.0]) == (math.inf, 0.0)
    assert all(math.isnan(v) for v in ttest_ind([1.0, 1.0], [1.0, 1.0]))


@pytest.mark.parametrize("d", [3, 40])
def test_logistic_cav_is_scikit_learns_logistic_regression(d: int) -> None:
    g = torch.Generator().manual_seed(d)
    x = torch.randn(60, d, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3, d)
    y = torch.where(x[:, 0] + 0.5 * torch.randn(60, generator=g, dtype=torch.float64) > 0, 1, -1)
    w, b = fit_linear(x, y.double())
    ref = LogisticRegression(C=1.0, tol=1e-12, max_iter=10_000).fit(x.numpy(), y.numpy())

    def objective(w: torch.Tensor, b: torch.Tensor) -> float:
        loss = torch.nn.functional.softplus(-y * (x @ w + b)).mean()
        return float(loss + w.square().sum() / (2 * len(x)))

    # both are iterative solvers of the same objective: equal minima, weights to 1e-4
    best = objective(torch.from_numpy(ref.coef_[0]), torch.tensor(ref.intercept_[0]))
    assert objective(w, b) == pytest.approx(best, rel=1e-10)
    np.testing.assert_allclose(w.numpy(), ref.coef_[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(float(b), ref.intercept_[0], rtol=1e-4, atol=1e-6)


def test_typed_errors() -> None:
    model = _planted()
    concepts, randoms, inputs = _sets(n_random=2, n=6)
    kw = dict(target=1)
    one = {"random0": randoms["random0"]}
    with pytest.raises(InvalidArgumentError, match="at least 2") as e:
        methods.tcav(model, inputs, concepts, "0", random_concepts=one, **kw)
    assert e.value.argument == "random_concepts"
    with pytest.raises(InvalidArgumentError, match="no layer 'nope'") as e:
        methods.tcav(model, inputs, concepts, ["nope"], random_concepts=randoms, **kw)
    assert e.value.argument == "layers"
    with pytest.raises(InvalidArgumentError, match="classifier") as e:
        methods.tcav(model, inputs, concepts, "0", random_concepts=randoms, classifier="sgd")
    with pytest.raises(InvalidArgumentError, match="alpha"):
        methods.tcav(model, inputs, concepts, "0", random_concepts=randoms, alpha=1.5)
    with pytest.raises(InvalidArgumentError, match="name each set once"):
        methods.tcav(model, inputs, concepts, "0", random_concepts={**randoms, **concepts})
    # a conv model with global pooling runs any image size, but the layer's size differs
    conv = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2, 2)
    ).double()
    images = torch.randn(4, 1, 6, 6, dtype=torch.float64)
    big = torch.randn(4, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(InvalidArgumentError, match="inputs' shape") as e:
        methods.tcav(
            conv, images, {"c": big}, "1", random_concepts={"r0": images, "r1": images}, target=0
        )
    assert e.value.argument == "concepts"
