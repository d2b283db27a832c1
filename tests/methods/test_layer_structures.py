"""Layers whose values are not a flat tuple of batch-first tensors: an LSTM's nested
``out, (h, c)``, recurrent hidden states with the batch in dim 1, packed sequences; and the
engine's error hierarchy as the README documents it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.errors import UnsupportedLayerError


def _shapes(obj: Any) -> Any:
    """The nesting of a result with shapes for tensors."""
    if isinstance(obj, torch.Tensor):
        return tuple(obj.shape)
    assert isinstance(obj, tuple), type(obj)
    return tuple(_shapes(v) for v in obj)


def _flat(obj: Any) -> list[torch.Tensor]:
    return [obj] if isinstance(obj, torch.Tensor) else [t for v in obj for t in _flat(v)]


class LSTMOutAndH(nn.Module):
    """Uses the LSTM's sequence output and its final hidden state (not c)."""

    def __init__(self, batch_first: bool = True) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=batch_first)
        self.fc = nn.Linear(4, 2)
        self.gh = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, (h, _) = self.lstm(x if self.batch_first else x.transpose(0, 1))
        last = out[:, -1] if self.batch_first else out[-1]
        return self.fc(last) + self.gh(h[-1])


class LSTMOnlyState(nn.Module):
    """Uses only the LSTM's (h, c), not its sequence output."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, c) = self.lstm(x)
        return self.fc(torch.cat([h[-1], c[-1]], dim=1))


class GRUHidden(nn.Module):
    """Uses the GRU's h_n, which is (num_layers, N, H): the batch in dim 1."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(3, 4, num_layers=2, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(x)
        return self.fc(h[-1])


def _setup(cls: type[nn.Module], **kw: Any) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = cls(**kw).double().eval()
    x = torch.randn(3, 5, 3, dtype=torch.float64)
    b = torch.randn(3, 5, 3, dtype=torch.float64) * 0.1
    return model, x, b


LSTM_SHAPES = ((3, 5, 4), ((3, 2, 4), (3, 2, 4)))  # out; h, c batch-first: (N, layers, H)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize(
    "method",
    ["layer_integrated_gradients", "layer_conductance", "layer_gradient_x_activation"],
)
def test_lstm_attributes_every_tensor_with_the_nesting(method: str, batch_first: bool) -> None:
    model, x, b = _setup(LSTMOutAndH, batch_first=batch_first)
    r = methods.attribute(model, x, method, target=1, layer="lstm", baselines=b)
    assert _shapes(r.attributions) == LSTM_SHAPES
    _, (h_attr, c_attr) = r.attributions
    assert float(h_attr.abs().sum()) > 0  # the h-path is attributed, not dropped
    assert torch.equal(c_attr, torch.zeros_like(c_attr))  # the model does not use c


def test_lstm_activation_is_every_tensor_batch_first() -> None:
    model, x, _ = _setup(LSTMOutAndH)
    out, (h, c) = model.lstm(x)
    r = methods.attribute(model, x, "layer_activation", layer="lstm")
    assert _shapes(r.attributions) == LSTM_SHAPES
    got_out, (got_h, got_c) = r.attributions
    torch.testing.assert_close(got_out, out)
    torch.testing.assert_close(got_h, h.transpose(0, 1))
    torch.testing.assert_close(got_c, c.transpose(0, 1))


@pytest.mark.parametrize("model_cls", [LSTMOutAndH, LSTMOnlyState, GRUHidden])
def test_layer_ig_completeness_over_all_parts(model_cls: type[nn.Module]) -> None:
    model, x, b = _setup(model_cls)
    r = methods.attribute(
        model,
        x,
        "layer_integrated_gradients",
        target=1,
        layer=next(n for n, m in model.named_children() if isinstance(m, nn.RNNBase)),
        baselines=b,
        return_convergence_delta=True,
    )
    change = (model(x) - model(b))[:, 1]
    total = sum(a.reshape(3, -1).sum(1) for a in _flat(r.attributions))
    torch.testing.assert_close(total, change, atol=1e-6, rtol=0)
    assert r.convergence_delta is not None
    assert float(r.convergence_delta.abs().max()) < 1e-6


@pytest.mark.parametrize("method", ["layer_integrated_gradients", "layer_conductance"])
def test_gru_hidden_state_with_batch_in_dim_1(method: str) -> None:
    model, x, b = _setup(GRUHidden)
    r = methods.attribute(
        model, x, method, target=0, layer="gru", baselines=b, n_steps=200,
        return_convergence_delta=True,
    )  # fmt: skip
    assert _shapes(r.attributions) == ((3, 5, 4), (3, 2, 4))  # h_n batch-first
    assert r.convergence_delta is not None
    assert float(r.convergence_delta.abs().max()) < 1e-4


@pytest.mark.parametrize(
    "method",
    ["layer_integrated_gradients", "layer_conductance", "layer_gradient_x_activation"],
)
def test_lstm_used_only_through_its_state(method: str) -> None:
    model, x, b = _setup(LSTMOnlyState)
    r = methods.attribute(model, x, method, target=0, layer="lstm", baselines=b)
    out_attr, (h_attr, c_attr) = r.attributions
    assert torch.equal(out_attr, torch.zeros_like(out_attr))  # out is unused
    assert float(h_attr.abs().sum()) > 0 and float(c_attr.abs().sum()) > 0


class Aside(nn.Module):
    """Returns a batch tensor and a per-feature tensor with no batch dim."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x.mean(0)


class AsideModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.aside = Aside()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, m = self.aside(x)
        return y + m


def test_a_layer_tensor_without_the_batch_is_a_typed_error() -> None:
    x = torch.randn(4, 3, dtype=torch.float64)
    with pytest.raises(UnsupportedLayerError, match=r"'aside'.*\(Tensor, Tensor\).*tensor 1"):
        methods.attribute(AsideModel(), x, "layer_integrated_gradients", target=0, layer="aside")


class Packed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lengths = torch.full((x.shape[0],), x.shape[1])
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True)
        _, (h, _) = self.lstm(packed)
        return h[-1]


def test_packed_sequences_are_a_typed_error_naming_the_structure() -> None:
    x = torch.randn(2, 5, 3)
    with pytest.raises(UnsupportedLayerError, match=r"'lstm'.*PackedSequence") as info:
        methods.attribute(Packed(), x, "layer_gradient_x_activation", target=0, layer="lstm")
    assert info.value.argument == "layer"


class Detached(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).detach() + x


def test_an_output_that_does_not_depend_on_the_layer_is_a_typed_error() -> None:
    x = torch.randn(2, 3)
    with pytest.raises(methods.InvalidArgumentError, match="does not depend on layer 'lin'"):
        methods.attribute(Detached(), x, "layer_gradient_x_activation", target=0, layer="lin")


def test_captum_ig_method_keyword_names_approximation_method() -> None:
    model = nn.Linear(3, 2).double()
    x = torch.randn(2, 3, dtype=torch.float64)
    with pytest.raises(methods.UnknownParameterError, match="approximation_method") as info:
        methods.attribute(model, x, "integrated_gradients", method="gausslegendre")
    assert info.value.argument == "method"


def test_error_hierarchy_is_as_documented() -> None:
    """Argument errors are ValueError or TypeError; ModelError (the model itself raised) is
    a RuntimeError; cancellation is neither."""
    argument_errors = [
        methods.InvalidArgumentError,
        methods.InvalidTypeError,
        methods.UnknownMethodError,
        methods.UnknownParameterError,
        methods.TargetError,
        methods.BaselineError,
        methods.UnsupportedModelError,
        UnsupportedLayerError,
    ]
    for cls in argument_errors:
        assert issubclass(cls, methods.AttributionError)
        assert issubclass(cls, (ValueError, TypeError)), cls
        assert not issubclass(cls, RuntimeError), cls
    assert issubclass(methods.ModelError, methods.AttributionError)
    assert issubclass(methods.ModelError, RuntimeError)
    assert not issubclass(methods.ModelError, (ValueError, TypeError))
    assert not issubclass(methods.AttributionCancelled, (ValueError, TypeError, RuntimeError))


class AdjacentReLUs(nn.Module):
    def __init__(self, separated: bool) -> None:
        super().__init__()
        self.l1, self.r1, self.r2, self.l2 = nn.Linear(4, 6), nn.ReLU(), nn.ReLU(), nn.Linear(6, 3)
        self.separated = separated

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.r1(self.l1(x))
        return self.l2(self.r2(h * 1.0 if self.separated else h))


def test_deconvolution_chains_adjacent_relus() -> None:
    """README: Captum's first ReLU reads a stale gradient; ours equals Captum with a no-op
    between the two ReLUs."""
    from captum.attr import Deconvolution

    torch.manual_seed(0)
    plain = AdjacentReLUs(separated=False).double()
    separated = AdjacentReLUs(separated=True).double()
    separated.load_state_dict(plain.state_dict())
    x = torch.randn(5, 4, dtype=torch.float64)
    ours = methods.attribute(plain, x, "deconvolution", target=0).attributions
    with pytest.warns(UserWarning):
        ref = Deconvolution(separated).attribute(x.clone().requires_grad_(), target=0)
        broken = Deconvolution(plain).attribute(x.clone().requires_grad_(), target=0)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    assert float((broken - ours).abs().max()) > 1e-3
