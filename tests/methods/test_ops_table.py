"""The engine's one table of operations (methods/engine/ops.py) and its readers."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import methods
from methods.engine import ops

ROOT = pathlib.Path(methods.__file__).parent


def test_each_callable_and_module_class_belongs_to_one_op() -> None:
    callables = [f for op in ops.OPS for f in (*op.functions, *op.inplace)]
    assert len(callables) == len(set(callables)) == len(ops.BY_FUNCTION)
    classes = [m for op in ops.OPS for m in op.modules]
    assert len(classes) == len(set(classes))
    assert set(ops.OUT_OF_PLACE) == {f for op in ops.OPS for f in op.inplace}


@pytest.mark.parametrize(
    ("module", "name"),
    [(nn.ReLU6(), "relu6"), (nn.Hardtanh(), "hardtanh"), (nn.ReLU(), "relu"),
     (nn.BatchNorm2d(3), "batch_norm"), (nn.MaxPool2d(2), "max_pool2d"),
     (nn.AdaptiveMaxPool1d(2), "adaptive_max_pool1d"), (nn.Linear(2, 2), "linear")],
)  # fmt: skip
def test_modules_map_to_their_op(module: nn.Module, name: str) -> None:
    op = ops.of_module(module)
    assert op is not None and op.name == name


def test_inplace_variants_map_to_their_out_of_place_twin() -> None:
    assert ops.OUT_OF_PLACE[F.relu_] is F.relu
    assert ops.OUT_OF_PLACE[torch.Tensor.sigmoid_] is torch.sigmoid
    assert ops.is_inplace(F.relu, {"inplace": True}) and not ops.is_inplace(F.relu, {})


def test_no_module_reaches_into_intercept_privates() -> None:
    for path in ROOT.rglob("*.py"):
        if path.name == "intercept.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "intercept"
            ):
                assert not node.attr.startswith("_"), f"{path}: intercept.{node.attr}"


class _Mixed(nn.Module):
    """The same ReLU reached four ways, and a sigmoid in place."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.a(x))
        h = F.relu(self.b(h)) + torch.relu(self.b(h)) + self.b(h).relu()
        return self.c(self.b(h).relu_().sigmoid_())


class _Modules(_Mixed):
    def __init__(self) -> None:
        super().__init__()
        self.s = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.a(x))
        h = self.relu(self.b(h)) + self.relu(self.b(h)) + self.relu(self.b(h))
        return self.c(self.s(self.relu(self.b(h))))


@pytest.mark.parametrize("method", ["deeplift", "guided_backprop", "deconvolution", "lrp"])
def test_functional_inplace_and_module_calls_get_the_same_rules(method: str) -> None:
    torch.manual_seed(0)
    mixed = _Mixed().double()
    twin = _Modules().double()
    twin.load_state_dict(mixed.state_dict(), strict=False)
    x = torch.randn(5, 4, dtype=torch.float64)
    a = methods.attribute(mixed, x, method, target=1).attributions
    b = methods.attribute(twin, x, method, target=1).attributions
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


class _InplaceAfterLayer(nn.Module):
    """nn.ReLU(inplace=True) writes into a linear layer's output: LRP's stabiliser must still
    read the pre-activation."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 2)
        self.relu = nn.ReLU(inplace=inplace)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.relu(self.a(x)).sigmoid_() if self.relu.inplace else
                      torch.sigmoid(self.relu(self.a(x))))  # fmt: skip


@pytest.mark.parametrize("method", ["lrp", "deeplift", "guided_backprop"])
def test_inplace_writes_do_not_change_what_rules_read(method: str) -> None:
    torch.manual_seed(0)
    inplace = _InplaceAfterLayer(True).double()
    plain = _InplaceAfterLayer(False).double()
    plain.load_state_dict(inplace.state_dict())
    x = torch.randn(5, 4, dtype=torch.float64)
    a = methods.attribute(inplace, x, method, target=1).attributions
    b = methods.attribute(plain, x, method, target=1).attributions
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
