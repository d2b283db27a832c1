"""The surrogate fits of LIME, Kernel SHAP and context attribution against scikit-learn, on
designs with fewer features than samples and with more (LIME on pixels)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from methods.engine.linear_models import lasso

sklearn_linear = pytest.importorskip("sklearn.linear_model")


@pytest.mark.parametrize(("samples", "features"), [(200, 12), (60, 400)])
def test_lasso_is_scikit_learn_s_on_narrow_and_wide_designs(samples: int, features: int) -> None:
    """Wide designs take the steps through the samples, never the features x features Gram
    matrix: the same minimiser as scikit-learn's Lasso with sample weights."""
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(2, samples, features, generator=g, dtype=torch.float64) > 0.5).double()
    y = x[:, :, :3].sum(2) - 2 * x[:, :, 3] + 0.1 * torch.randn(2, samples, generator=g,
                                                                   dtype=torch.float64)  # fmt: skip
    w = torch.rand(2, samples, generator=g, dtype=torch.float64) + 0.1
    coef, intercept = lasso(x, y, w, alpha=0.01, max_iter=20000, tol=1e-12)
    for i in range(2):
        ref = sklearn_linear.Lasso(alpha=0.01, tol=1e-12, max_iter=200000)
        ref.fit(x[i].numpy(), y[i].numpy(), sample_weight=w[i].numpy())
        np.testing.assert_allclose(coef[i].numpy(), ref.coef_, atol=2e-5)
        np.testing.assert_allclose(float(intercept[i]), ref.intercept_, atol=2e-5)
