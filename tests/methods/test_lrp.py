"""LRP: Captum parity, Captum's oracle values and rules, and what Captum gets wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from captum.attr import LRP
from torch import nn

import methods
from tests import zoo
from tests.captum_models import ConvNetOneConv

#: every test twice, channels-last (rounded as another CPU would) and as given (conftest)
pytestmark = pytest.mark.usefixtures("both_layouts")

F64 = torch.float64


class SimpleLRPModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3, bias=False)
        self.relu = nn.ReLU()
        self.linear2 = nn.Linear(3, 1, bias=False)
        self.dropout = nn.Dropout(p=0.01)
        with torch.no_grad():
            self.linear.weight.fill_(2.0)
            self.linear2.weight.fill_(3.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear2(self.relu(self.linear(x))))


class SimpleFunctional(SimpleLRPModel):
    """The same network with a functional ReLU and F.linear: Captum's hooks miss both."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.relu(self.linear(x)), self.linear2.weight)


@pytest.mark.parametrize("case", ["mlp", "cnn", "multidim", "conv_twin"])
def test_parity_on_the_model_matrix(case: str) -> None:
    c = zoo.by_name(case)
    ref, ref_delta = LRP(c.model).attribute(
        c.inputs, target=c.target, return_convergence_delta=True
    )
    r = methods.attribute(c.model, c.inputs, "lrp", target=c.target, return_convergence_delta=True)
    torch.testing.assert_close(r.attributions, ref.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(r.convergence_delta, ref_delta, rtol=1e-10, atol=1e-10)


def test_oracles() -> None:
    m = SimpleLRPModel().double().eval()
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    r = methods.attribute(m, x, "lrp", return_convergence_delta=True)
    torch.testing.assert_close(r.attributions, torch.tensor([[18.0, 36.0, 54.0]], dtype=F64))
    assert float(r.convergence_delta.abs().max()) < 1e-7  # epsilon = 1e-9 absorbs a little
    xb = torch.tensor([[1.0, 2.0, 3.0], [3.0, 6.0, 9.0]], dtype=F64)
    r = methods.attribute(m, xb, "lrp", target=0).attributions
    torch.testing.assert_close(r, torch.tensor([[18.0, 36, 54], [54, 108, 162]], dtype=F64))
    conv = ConvNetOneConv().double()
    ci = torch.arange(16.0, dtype=F64).view(1, 1, 4, 4)
    r = methods.attribute(
        conv, ci, "lrp", target=int(conv(ci).argmax()), return_convergence_delta=True
    )
    want = torch.tensor([[0, 1, 2, 3], [0, 5, 6, 7], [0, 9, 10, 11], [0, 0, 0, 0]], dtype=F64)
    torch.testing.assert_close(r.attributions, want.view(1, 1, 4, 4))


RULE_CASES = [
    ({"linear": {"rule": "gamma", "gamma": 1.0}, "linear2": "gamma"}, [28 / 3, 104 / 3, 52]),
    ({"linear": "alpha1_beta0", "linear2": "alpha1_beta0"}, [12, 33.6, 50.4]),
    ({"linear": "identity", "linear2": "epsilon"}, [24, 36, 36]),
]


@pytest.mark.parametrize(("rules", "want"), RULE_CASES)
def test_captum_rule_oracles(rules: dict[str, Any], want: list[float]) -> None:
    m = SimpleLRPModel().double().eval()
    with torch.no_grad():
        m.linear.weight[0][0] = -2
    state = {k: v.clone() for k, v in m.state_dict().items()}
    x = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    r = methods.attribute(m, x, "lrp", rules=rules).attributions
    torch.testing.assert_close(r, torch.tensor([want], dtype=F64))
    for k, v in m.state_dict().items():  # the rules never touch the weights
        assert torch.equal(v, state[k])


def test_z_plus_equals_alpha1_beta0_without_bias() -> None:
    c = zoo.by_name("mlp")
    zp = methods.attribute(
        c.model, c.inputs, "lrp", target=c.target, rules={"net.0": "z_plus"}
    ).attributions
    ab = methods.attribute(
        c.model,
        c.inputs,
        "lrp",
        target=c.target,
        rules={"net.0": {"rule": "alpha1_beta0", "set_bias_to_zero": True}},
    ).attributions
    torch.testing.assert_close(zp, ab)


def test_functional_twin_gets_the_module_numbers() -> None:
    a = SimpleLRPModel().double().eval()
    b = SimpleFunctional().double().eval()
    b.load_state_dict(a.state_dict())
    x = torch.tensor([[1.0, -2.0, 3.0], [0.5, 2.0, -1.0]], dtype=F64)
    ra = methods.attribute(a, x, "lrp", target=0).attributions
    rb = methods.attribute(b, x, "lrp", target=0).attributions
    torch.testing.assert_close(ra, rb)


def test_reused_module_is_propagated_per_call() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3)
            self.out = nn.Linear(3, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(F.relu(self.lin(F.relu(self.lin(x)))))

    class Unrolled(nn.Module):
        def __init__(self, t: Twice) -> None:
            super().__init__()
            self.a, self.b, self.out = t.lin, nn.Linear(3, 3), t.out
            self.b.load_state_dict(t.lin.state_dict())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(F.relu(self.b(F.relu(self.a(x)))))

    torch.manual_seed(3)
    t = Twice().double()
    u = Unrolled(t).double()
    x = torch.randn(4, 3, dtype=F64)
    with pytest.raises(RuntimeError):
        LRP(t).attribute(x)  # Captum: a module used twice is refused
    torch.testing.assert_close(
        methods.attribute(t, x, "lrp").attributions, methods.attribute(u, x, "lrp").attributions
    )


def test_bad_rules_name_the_argument() -> None:
    c = zoo.by_name("mlp")
    for rules in ({"net.9": "epsilon"}, {"net.0": "nope"}, {"net.0": {"rule": "gamma", "x": 1}}):
        with pytest.raises(methods.InvalidArgumentError) as e:
            methods.attribute(c.model, c.inputs, "lrp", target=0, rules=rules)
        assert e.value.argument == "rules"


class Residual(nn.Module):
    """y = linear(x) + x: the residual connection of issue 22 defect 2."""

    def __init__(self, weight: float = 5.0) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.linear.weight.fill_(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + x


def test_relevance_is_conserved_through_a_residual_add() -> None:
    """Hand-computed: y_1 = 25 + 3 splits 25 : 3 between the branches; the linear branch's 25
    goes to x as 2*5 : 3*5. Captum (and our engine before) doubled it: [[11.2, 44.8]]."""
    x = torch.tensor([[2.0, 3.0]], dtype=F64)
    res = methods.attribute(Residual().double(), x, "lrp", target=1,
                            return_convergence_delta=True)  # fmt: skip
    torch.testing.assert_close(res.attributions, torch.tensor([[10.0, 18.0]], dtype=F64))
    assert res.convergence_delta.abs().max() < 1e-7  # epsilon = 1e-9 absorbs a little


def test_the_add_rule_is_chosen_by_rules() -> None:
    """rules["add"] sets the rule of every addition: z_plus hands a negative term nothing."""
    m = Residual(weight=-1.0).double()  # linear(x) = [-5, -5]: y_1 = -5 + 3
    x = torch.tensor([[2.0, 3.0]], dtype=F64)

    def lrp(**kw: Any) -> torch.Tensor:
        return methods.attribute(m, x, "lrp", target=1, **kw).attributions

    # epsilon: shares -5/-2 and 3/-2 of y_1 = -2; the linear branch gives x its -5 as 2 : 3
    torch.testing.assert_close(lrp(), torch.tensor([[-2.0, 0.0]], dtype=F64))
    # z_plus: the whole -2 goes to the skip term x_1
    torch.testing.assert_close(lrp(rules={"add": "z_plus"}), torch.tensor([[0.0, -2.0]], dtype=F64))
    torch.testing.assert_close(
        lrp(rules={"add": "alpha1_beta0"}), torch.tensor([[0.0, -2.0]], dtype=F64)
    )
    with pytest.raises(methods.InvalidArgumentError) as e:
        lrp(rules={"add": "nope"})
    assert e.value.argument == "rules"


def test_a_module_named_add_keeps_its_path_meaning() -> None:
    """rules names a module's path first: its rule applies to the additions made inside it,
    the addition outside (``- 0 * x.sum``) keeps the default."""

    class Add(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return a + b

    class Net(Residual):
        def __init__(self) -> None:
            super().__init__(weight=-1.0)
            self.add = Add()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.add(self.linear(x), x) - 0.0 * x.sum(1, keepdim=True)

    x = torch.tensor([[2.0, 3.0]], dtype=F64)
    ours = methods.attribute(Net().double(), x, "lrp", target=1, rules={"add": "z_plus"})
    torch.testing.assert_close(ours.attributions, torch.tensor([[0.0, -2.0]], dtype=F64))


@pytest.mark.parametrize("form", ["add", "iadd", "torch_add_alpha", "sub", "rsub", "bias"])
def test_every_form_of_addition_conserves_relevance(form: str) -> None:
    """Residual blocks as models write them: ``+``, in-place ``+=`` after a ReLU(inplace),
    ``torch.add(alpha=)``, subtraction, a constant minus a tensor, a broadcast bias."""

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(2, 2, 3, padding=1, bias=False)
            self.conv2 = nn.Conv2d(2, 2, 3, padding=1, bias=False)
            self.relu = nn.ReLU(inplace=True)
            self.head = nn.Linear(2 * 4 * 4, 3, bias=False)
            self.shift = nn.Parameter(torch.full((2, 1, 1), 0.3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.conv2(self.relu(self.conv1(x)))
            if form == "add":
                out = out + x
            elif form == "iadd":
                out += x
            elif form == "torch_add_alpha":
                out = torch.add(out, x, alpha=0.5)
            elif form == "sub":
                out = out - x
            elif form == "rsub":
                out = 2.0 - out
            else:
                out = out + self.shift
            return self.head(self.relu(out).flatten(1))

    torch.manual_seed(0)
    m = Block().double()
    x = torch.rand(3, 2, 4, 4, dtype=F64)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    res = methods.attribute(m, x, "lrp", target=2, return_convergence_delta=True)
    absorbed = form in ("rsub", "bias")  # the constant term keeps its share of the relevance
    if not absorbed:
        assert res.convergence_delta.abs().max() < 1e-8
    assert torch.isfinite(res.attributions).all()
    for k, v in m.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_a_sum_of_two_zeros_in_float16_shares_nothing() -> None:
    """Two ReLU branches both off: no 0 / 0 (eps 1e-9 is 0 in float16; shares in float32)."""

    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2)
            with torch.no_grad():
                self.a.bias.fill_(-50.0)
                self.b.bias.fill_(-50.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(F.relu(self.a(x)) + F.relu(self.b(x)))

    torch.manual_seed(0)
    res = methods.attribute(TwoBranches().half(), torch.rand(2, 3).half(), "lrp", target=0)
    assert torch.isfinite(res.attributions).all()
