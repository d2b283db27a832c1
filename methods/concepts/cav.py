"""Concept activation vectors: a linear classifier of a concept's layer activations against a
random set's, fit in torch (no scikit-learn at run time).

``"logistic"`` is L2-regularised logistic regression with an unpenalised intercept, the
objective of scikit-learn's ``LogisticRegression(C=1.0)`` (mean loss + ||w||^2 / (2n)), fit by
full-batch L-BFGS in float64, so the same activations always give the same CAV.
``"linear_svm"`` is the same with the squared hinge loss (scikit-learn's ``LinearSVC``).
Captum's default, an SGD classifier, depends on its shuffling; these do not.

A third of each set (rounded down, at least one example left to fit) is held out, picked by
``seed``; ``accuracy`` is the classifier's on those examples (on the fitted ones when nothing
could be held out). The CAV is the unit normal of the fitted boundary, pointing towards the
concept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from methods.errors import InvalidArgumentError

CLASSIFIERS = ("logistic", "linear_svm")
#: the share of each set held out to measure the classifier's accuracy (Captum's default)
HELD_OUT = 0.33


@dataclass(frozen=True)
class Cav:
    """A concept's direction at a layer, and how well the concept separated there."""

    vector: Tensor  # (D,), unit norm, towards the concept
    accuracy: float


def check_classifier(classifier: object) -> str:
    if classifier not in CLASSIFIERS:
        raise InvalidArgumentError(
            f"classifier must be one of {list(CLASSIFIERS)}, got {classifier!r}",
            argument="classifier",
        )
    return str(classifier)


def _split(n: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    order = torch.randperm(n, generator=generator)
    n_out = min(int(n * HELD_OUT), n - 1)
    return order[n_out:], order[:n_out]


def fit_linear(x: Tensor, y: Tensor, classifier: str = "logistic") -> tuple[Tensor, Tensor]:
    """``(w, b)`` minimising mean loss(y * (x @ w + b)) + ||w||^2 / (2n), labels ``y`` +-1."""
    x = x.detach().to(torch.float64)
    y = y.detach().to(torch.float64)
    # centred and scaled for the optimiser; the weights are mapped back after
    mean = x.mean(0)
    scale = x.sub(mean).abs().max().clamp_min(1e-12)
    z = (x - mean) / scale
    w = torch.zeros(x.shape[1], dtype=torch.float64)
    b = torch.zeros((), dtype=torch.float64)
    n = x.shape[0]
    opt = torch.optim.LBFGS(
        [w, b],
        lr=1.0,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-16,
        history_size=20,
        line_search_fn="strong_wolfe",
    )
    ridge = 1.0 / (scale.square() * n)  # the penalty is on the original features' w / scale

    def closure() -> Tensor:
        # the loss and its gradient in closed form: autograd's bookkeeping cost ten times the
        # arithmetic on these small problems, and a fit takes a hundred evaluations
        margins = y * (z @ w + b)
        if classifier == "logistic":
            loss = torch.nn.functional.softplus(-margins).mean()
            slope = -torch.sigmoid(-margins) / n
        else:
            hinge = torch.clamp(1.0 - margins, min=0.0)
            loss = hinge.square().mean()
            slope = -2.0 * hinge / n
        g = slope * y
        w.grad = z.T @ g + ridge * w
        b.grad = g.sum()
        return loss + 0.5 * ridge * w.square().sum()

    opt.step(closure)
    w_x = w / scale
    return w_x, b - mean @ w_x


def train_cav(
    concept: Tensor, random: Tensor, *, classifier: str = "logistic", seed: int = 0
) -> Cav:
    """The CAV of ``concept`` activations ``(n_c, D)`` against ``random`` ones ``(n_r, D)``."""
    if concept.shape[1:] != random.shape[1:]:
        raise InvalidArgumentError(
            f"a concept's activations have {tuple(concept.shape[1:])} features and a random "
            f"set's {tuple(random.shape[1:])}; the examples of every set must have the "
            "model's input shape",
            argument="concepts",
        )
    generator = torch.Generator().manual_seed(seed)
    fit_c, out_c = _split(concept.shape[0], generator)
    fit_r, out_r = _split(random.shape[0], generator)
    x = torch.cat([concept[fit_c], random[fit_r]]).to(torch.float64)
    y = torch.cat([torch.ones(len(fit_c)), -torch.ones(len(fit_r))]).to(torch.float64)
    w, b = fit_linear(x, y, classifier)
    if len(out_c) and len(out_r):
        x_out = torch.cat([concept[out_c], random[out_r]]).to(torch.float64)
        y_out = torch.cat([torch.ones(len(out_c)), -torch.ones(len(out_r))]).to(torch.float64)
    else:
        x_out, y_out = x, y
    accuracy = float(((x_out @ w + b > 0) == (y_out > 0)).to(torch.float64).mean())
    norm = w.norm()
    vector = w / norm if norm > 0 else w
    return Cav(vector=vector.to(concept.dtype), accuracy=accuracy)
