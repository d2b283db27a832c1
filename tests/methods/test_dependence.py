"""``methods.partial_dependence`` against scikit-learn's ``partial_dependence(method="brute")``:
the same grid (distinct values, or points between the percentiles), the same average and ICE
curves, in one batched forward; bad arguments name themselves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.inspection import partial_dependence as sk_partial_dependence

import methods
from methods.errors import AttributionError


def mlp(outputs: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, outputs)).double()  # fmt: skip


class Classifier(ClassifierMixin, BaseEstimator):
    """A torch classifier as scikit-learn calls one: predict_proba (softmax)."""

    def __init__(self, model: Any = None) -> None:
        self.model = model

    def fit(self, X: Any, y: Any) -> Classifier:
        self.classes_ = np.arange(3)
        return self

    def predict_proba(self, X: Any) -> Any:
        with torch.no_grad():
            return torch.softmax(self.model(torch.tensor(X)), -1).numpy()


class Regressor(RegressorMixin, BaseEstimator):
    def __init__(self, model: Any = None) -> None:
        self.model = model

    def fit(self, X: Any, y: Any) -> Regressor:
        self.fitted_ = True
        return self

    def predict(self, X: Any) -> Any:
        with torch.no_grad():
            return self.model(torch.tensor(X))[:, 0].numpy()


def rows() -> np.ndarray:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 5))
    x[:, 2] = rng.integers(0, 4, 40)  # few distinct values: the grid is them
    return x


@pytest.mark.parametrize("feature", [0, 2, 4])
@pytest.mark.parametrize(("resolution", "percentiles"), [(15, (0.05, 0.95)), (7, (0.2, 0.6))])
def test_a_classifiers_curves_are_scikit_learns(
    feature: int, resolution: int, percentiles: tuple[float, float]
) -> None:
    model, x = mlp(3), rows()
    est = Classifier(model).fit(x, None)
    want = sk_partial_dependence(est, x, [feature], method="brute", kind="both",
                                 grid_resolution=resolution, percentiles=percentiles)  # fmt: skip
    (got,) = methods.partial_dependence(
        model, torch.tensor(x), [feature], target=1, grid_resolution=resolution,
        percentiles=percentiles, kind="both", output="probability", batch_size=23,
    )  # fmt: skip
    np.testing.assert_allclose(got.grid, want["grid_values"][0], rtol=0, atol=0)
    np.testing.assert_allclose(got.average, want["average"][1], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.individual, want["individual"][1], rtol=1e-12, atol=1e-15)


def test_a_regressions_curves_and_the_kinds() -> None:
    model, x = mlp(1), rows()
    want = sk_partial_dependence(Regressor(model).fit(x, None), x, [3], method="brute",
                                 kind="average", grid_resolution=15)  # ours by default  # fmt: skip
    (avg,) = methods.partial_dependence(model, torch.tensor(x), [3])
    np.testing.assert_allclose(avg.average, want["average"][0], rtol=1e-12)
    assert avg.individual is None
    (ice,) = methods.partial_dependence(model, torch.tensor(x), [3], kind="individual")
    assert ice.average is None and ice.individual.shape == (40, 15)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"features": [5]}, "features.0"),
        ({"features": []}, "features"),
        ({"features": [0], "grid_resolution": 1}, "grid_resolution"),
        ({"features": [0], "percentiles": (0.9, 0.1)}, "percentiles"),
        ({"features": [0], "kind": "mean"}, "kind"),
        ({"features": [0], "target": None}, "target"),  # three outputs: name one
        ({"features": [0], "target": 3}, "target"),
    ],
)
def test_bad_arguments_name_themselves(kwargs: dict[str, Any], argument: str) -> None:
    kw = {"target": 0, **kwargs}
    with pytest.raises(AttributionError) as err:
        methods.partial_dependence(mlp(3), torch.tensor(rows()), **kw)
    assert err.value.argument == argument


def test_a_column_of_one_value_between_the_percentiles_is_refused() -> None:
    x = rows()
    x[:, 1] = 0.5
    x[:2, 1] = [0.0, 1.0]  # three distinct values, enough for a grid of 3; percentiles equal
    with pytest.raises(AttributionError, match="too close") as err:
        methods.partial_dependence(mlp(3), torch.tensor(x), [1], target=0, grid_resolution=3)
    assert err.value.argument == "percentiles"
