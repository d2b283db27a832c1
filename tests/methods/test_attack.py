"""methods.attack: FGSM and PGD equal to Captum's (float64, 1e-10) for both losses, targeted
or not, with masks, bounds and both norms; an example's attack does not depend on its batch;
random starts are seeded; typed errors."""

from __future__ import annotations

import pytest
import torch
from captum.robust import FGSM, PGD
from torch import nn

import methods
from methods.errors import InvalidArgumentError, UnknownParameterError

F64 = torch.float64


def _models() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    logits = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 4)).double().eval()
    probs = nn.Sequential(logits, nn.Softmax(dim=1)).eval()
    return logits, probs


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(3, 4)
        self.b = nn.Linear(2, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.a(x) + torch.tanh(self.b(y)), dim=1)


X = torch.randn(5, 6, generator=torch.Generator().manual_seed(1), dtype=F64)
Y = torch.tensor([0, 1, 2, 3, 1])


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("targeted", [False, True])
@pytest.mark.parametrize("loss", ["nll", "cross_entropy"])
def test_fgsm_equals_captums(loss: str, targeted: bool) -> None:
    logits, probs = _models()
    model = probs if loss == "nll" else logits
    captum_loss = None if loss == "nll" else nn.CrossEntropyLoss(reduction="none")
    mask = (torch.arange(6) % 2 == 0).to(F64).expand(5, 6)
    for kw in ({}, {"lower_bound": -0.5, "upper_bound": 0.7}):
        ours = methods.attack(
            model, X, "fgsm", target=Y, epsilon=0.1, targeted=targeted, loss=loss, mask=mask, **kw
        )
        ref = FGSM(model, captum_loss, **kw).perturb(X, 0.1, Y, targeted=targeted, mask=mask)
        close(ours.perturbed, ref)
        with torch.no_grad():
            close(ours.predictions, model(ref))
            flipped = model(ref).argmax(1) != model(X).argmax(1)
        assert torch.equal(ours.flipped, flipped)


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("loss", ["nll", "cross_entropy"])
def test_pgd_equals_captums(loss: str, norm: str) -> None:
    logits, probs = _models()
    model = probs if loss == "nll" else logits
    captum_loss = None if loss == "nll" else nn.CrossEntropyLoss(reduction="none")
    for targeted in (False, True):
        kw = dict(radius=0.3, step_size=0.05, step_num=7, norm=norm, targeted=targeted)
        ours = methods.attack(
            model, X, "pgd", target=Y, loss=loss, lower_bound=-4.0, upper_bound=4.0, **kw
        )
        ref = PGD(model, captum_loss, lower_bound=-4.0, upper_bound=4.0).perturb(X, target=Y, **kw)
        close(ours.perturbed, ref)
        diff = (ours.perturbed - X).reshape(5, -1)
        if norm == "Linf":
            assert diff.abs().max() <= 0.3 + 1e-12
        else:
            assert (diff.norm(dim=1) <= 0.3 + 1e-9).all()


def test_two_inputs_and_a_per_example_target() -> None:
    torch.manual_seed(3)
    model = TwoInputs().double().eval()
    a = torch.randn(4, 3, dtype=F64)
    b = torch.randn(4, 2, dtype=F64)
    y = [0, 3, 2, 1]
    ours = methods.attack(model, (a, b), "pgd", target=y, radius=0.2, step_size=0.05, step_num=5)
    ref = PGD(model).perturb((a, b), radius=0.2, step_size=0.05, step_num=5, target=y)
    assert isinstance(ours.perturbed, tuple)
    for o, r in zip(ours.perturbed, ref, strict=True):
        close(o, r)


def test_an_examples_attack_does_not_depend_on_its_batch() -> None:
    logits, _ = _models()
    whole = methods.attack(
        logits, X, "pgd", target=Y, loss="cross_entropy", radius=0.3, step_size=0.05, step_num=5
    )
    for i in range(len(X)):
        alone = methods.attack(
            logits,
            X[i : i + 1],
            "pgd",
            target=Y[i : i + 1],
            loss="cross_entropy",
            radius=0.3,
            step_size=0.05,
            step_num=5,
        )
        close(alone.perturbed[0], whole.perturbed[i])


def test_random_starts_are_seeded_and_stay_in_the_ball() -> None:
    logits, _ = _models()
    kw = dict(
        target=Y, loss="cross_entropy", radius=0.2, step_size=0.01, step_num=2, random_start=True
    )
    for norm in ("Linf", "L2"):
        a = methods.attack(logits, X, "pgd", norm=norm, seed=5, **kw)
        b = methods.attack(logits, X, "pgd", norm=norm, seed=5, **kw)
        c = methods.attack(logits, X, "pgd", norm=norm, seed=6, **kw)
        assert torch.equal(a.perturbed, b.perturbed) and not torch.equal(a.perturbed, c.perturbed)
        d = (a.perturbed - X).reshape(5, -1)
        size = d.abs().amax(1) if norm == "Linf" else d.norm(dim=1)
        assert (size <= 0.2 + 1e-9).all()


def test_the_model_is_left_as_it_was() -> None:
    logits, _ = _models()
    flags = [p.requires_grad for p in logits.parameters()]
    methods.attack(logits, X, "fgsm", target=Y, loss="cross_entropy", epsilon=0.1)
    assert [p.requires_grad for p in logits.parameters()] == flags
    assert all(p.grad is None for p in logits.parameters())


def test_typed_errors() -> None:
    logits, _ = _models()
    with pytest.raises(InvalidArgumentError, match="method must be one of"):
        methods.attack(logits, X, "cw", target=Y)
    with pytest.raises(UnknownParameterError) as e:
        methods.attack(logits, X, "fgsm", target=Y, epsilon=0.1, radius=1.0)
    assert e.value.argument == "radius"
    with pytest.raises(InvalidArgumentError, match="needs epsilon"):
        methods.attack(logits, X, "fgsm", target=Y)
    with pytest.raises(InvalidArgumentError, match="norm"):
        methods.attack(logits, X, "pgd", target=Y, radius=1, step_size=0.1, step_num=2, norm="L1")
    with pytest.raises(InvalidArgumentError, match="step_num"):
        methods.attack(logits, X, "pgd", target=Y, radius=1, step_size=0.1, step_num=0)
    with pytest.raises(InvalidArgumentError, match="epsilon must be >= 0") as e:
        methods.attack(logits, X, "fgsm", target=Y, epsilon=-0.5, loss="cross_entropy")
    assert e.value.argument == "epsilon"
    with pytest.raises(InvalidArgumentError, match="loss"):
        methods.attack(logits, X, "fgsm", target=Y, epsilon=0.1, loss="hinge")
    with pytest.raises(InvalidArgumentError, match="mask"):
        methods.attack(logits, X, "fgsm", target=Y, epsilon=0.1, mask=torch.ones(3))
    with pytest.raises(InvalidArgumentError, match="lower_bound"):
        methods.attack(logits, X, "fgsm", target=Y, epsilon=0.1, lower_bound=1, upper_bound=0)


def test_nll_on_logits_is_refused_not_silently_nan() -> None:
    """Captum's default loss on a model that returns logits gives NaN gradients, so nothing
    moves; the engine says why instead."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4) * 3
    with pytest.raises(InvalidArgumentError, match="cross_entropy") as err:
        methods.attack(model, x, "fgsm", target=0, epsilon=0.1)
    assert err.value.argument == "loss"
    moved = methods.attack(model, x, "fgsm", target=0, epsilon=0.1, loss="cross_entropy")
    assert not torch.equal(moved.perturbed, x)


# -- a loss that does not saturate, and saying when nothing moved (issue 56) ----------------

#: README's example: tabular-mlp is so sure of it that its softmax rounds to exactly 1 in
#: float32, so cross-entropy's gradient is below Captum's zero threshold everywhere
SURE = torch.tensor([[1.0, 0.3, -0.2, 0.9, 0.1, -0.5, 0.4, 0.0]])


def _tabular_mlp() -> nn.Module:
    from model_registry.builtin import build

    net, _ = build("tabular-mlp")
    return net.eval()


@pytest.mark.parametrize(
    ("method", "budget"),
    [("fgsm", {"epsilon": 1.0}), ("pgd", {"radius": 1.0, "step_size": 0.2, "step_num": 10})],
)
def test_margin_flips_what_a_saturated_cross_entropy_cannot_move(
    method: str, budget: dict[str, float]
) -> None:
    net = _tabular_mlp()
    with torch.no_grad():
        target = net(SURE).argmax(1)
    stuck = methods.attack(net, SURE, method, target=target, loss="cross_entropy", **budget)
    assert torch.equal(stuck.perturbed, SURE)  # not one step was taken ...
    assert stuck.zero_gradient.tolist() == [True]  # ... and the answer says why
    assert stuck.flipped.tolist() == [False]
    moved = methods.attack(net, SURE, method, target=target, loss="margin", **budget)
    assert moved.zero_gradient.tolist() == [False]
    assert moved.flipped.tolist() == [True]
    assert (moved.perturbed - SURE).abs().max() <= 1.0 + 1e-6


def _margin_reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d/dx of (largest other logit - the target's), one example at a time, literally."""
    grads = []
    for i in range(len(x)):
        xi = x[i : i + 1].clone().requires_grad_()
        out = model(xi)[0]
        others = [out[c] for c in range(out.shape[0]) if c != int(y[i])]
        margin = torch.stack(others).max() - out[int(y[i])]
        (g,) = torch.autograd.grad(margin, xi)
        grads.append(g[0])
    return torch.stack(grads)


@pytest.mark.parametrize("targeted", [False, True])
def test_margin_steps_the_way_the_attack_means(targeted: bool) -> None:
    """Untargeted: the step ascends the margin (another class gains on the target); targeted:
    it descends it (the target gains on the best other), as a literal reference steps."""
    logits, _ = _models()
    g = _margin_reference(logits, X, Y)
    sign = -1.0 if targeted else 1.0
    want = torch.where(g.abs() > 1e-6, X + sign * 0.01 * torch.sign(g), X)
    got = methods.attack(
        logits, X, "fgsm", target=Y, loss="margin", epsilon=0.01, targeted=targeted
    )
    close(got.perturbed, want)
    assert got.zero_gradient.tolist() == [False] * len(X)

    def margin(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = logits(x)
        best = out.scatter(1, Y.unsqueeze(1), -torch.inf).amax(1)
        return best - out.gather(1, Y.unsqueeze(1)).squeeze(1)

    grew = margin(got.perturbed) > margin(X)
    assert grew.tolist() == [not targeted] * len(X)


def test_a_targeted_margin_attack_reaches_its_class_from_a_saturated_input() -> None:
    net = _tabular_mlp()
    for wanted in (0, 1):
        reached = methods.attack(
            net, SURE, "pgd", target=wanted, loss="margin", targeted=True,
            radius=2.0, step_size=0.2, step_num=20,
        )  # fmt: skip
        assert reached.predictions.argmax(1).tolist() == [wanted]
        assert reached.zero_gradient.tolist() == [False]


def test_zero_gradient_is_per_example() -> None:
    """In one batch, the saturated example says it could not move, the other moved; neither's
    answer depends on the other (the losses are summed, per example)."""
    net = _tabular_mlp()
    x = torch.cat([SURE, torch.tensor([[0.2, 0.1, 0.0, 0.1, 0.0, 0.0, 0.0, 0.0]])])
    with torch.no_grad():
        target = net(x).argmax(1)
    kw = {"target": target, "loss": "cross_entropy", "radius": 0.3, "step_size": 0.1}
    got = methods.attack(net, x, "pgd", step_num=3, **kw)
    assert got.zero_gradient.tolist() == [True, False]
    assert torch.equal(got.perturbed[0], x[0]) and not torch.equal(got.perturbed[1], x[1])
    # the same with Captum's default loss on the model's probabilities
    nll = methods.attack(nn.Sequential(net, nn.Softmax(dim=1)), x, "fgsm", target=target,
                         epsilon=0.1)  # fmt: skip
    assert nll.zero_gradient.tolist() == [True, False]


def test_zero_gradient_counts_only_what_the_mask_lets_move() -> None:
    """A mask over features the model does not read: no step can move the example, whatever
    the gradient elsewhere; it says so (a masked-out gradient once read as "moved")."""
    net = nn.Linear(4, 2).double().eval()
    with torch.no_grad():
        net.weight[:, 2:] = 0  # features 2 and 3 do not count
    x = torch.randn(2, 4, dtype=F64)
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0], dtype=F64).expand(2, 4)
    got = methods.attack(net, x, "fgsm", target=[0, 1], loss="margin", epsilon=1.0, mask=mask)
    assert torch.equal(got.perturbed, x) and got.zero_gradient.tolist() == [True, True]
    free = methods.attack(net, x, "fgsm", target=[0, 1], loss="margin", epsilon=1.0)
    assert free.zero_gradient.tolist() == [False, False]


def test_margin_on_an_output_with_positions() -> None:
    """An (N, C, L) output and a (class, position) target: the other classes are those at the
    target's position (dim 1, where a cross-entropy's softmax runs)."""
    torch.manual_seed(2)
    conv = nn.Conv1d(2, 3, 3, padding=1).double().eval()
    x = torch.randn(2, 2, 5, dtype=F64)
    y = torch.tensor([[0, 1], [2, 4]])
    got = methods.attack(conv, x, "fgsm", target=y, loss="margin", epsilon=0.1)
    grads = []
    for i in range(2):
        xi = x[i : i + 1].clone().requires_grad_()
        out = conv(xi)[0]
        c, p = (int(v) for v in y[i])
        best = torch.stack([out[k, p] for k in range(3) if k != c]).max()
        (g,) = torch.autograd.grad(best - out[c, p], xi)
        grads.append(g[0])
    g = torch.stack(grads)
    close(got.perturbed, torch.where(g.abs() > 1e-6, x + 0.1 * torch.sign(g), x))


def test_margin_needs_classes_to_compare() -> None:
    one = nn.Linear(4, 1).double()
    x = torch.randn(3, 4, dtype=F64)
    with pytest.raises(InvalidArgumentError, match="margin") as err:
        methods.attack(one, x, "fgsm", target=0, loss="margin", epsilon=0.1)
    assert err.value.argument == "loss"
    scalar = nn.Sequential(nn.Linear(4, 1), nn.Flatten(0)).double()
    with pytest.raises(InvalidArgumentError, match="margin"):
        methods.attack(scalar, x, "fgsm", target=None, loss="margin", epsilon=0.1)


def test_a_counterfactual_step_search_takes_the_margin() -> None:
    """The least FGSM step that flips README's example: none in range with a saturated
    cross-entropy (it cannot move), one with the margin."""
    net = _tabular_mlp()
    with torch.no_grad():
        target = net(SURE).argmax(1)
    search = {"arg_min": 0.0, "arg_max": 2.0, "arg_step": 0.05, "target": target}
    stuck = methods.min_perturbation(net, SURE, "fgsm", loss="cross_entropy", **search)
    found = methods.min_perturbation(net, SURE, "fgsm", loss="margin", **search)
    assert stuck.min_param == [None]
    assert found.min_param[0] is not None and 0 < found.min_param[0] <= 2.0
