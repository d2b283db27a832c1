"""The shared engine: argument errors, TorchScript, chunking under memory pressure, cuDNN."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import methods
from methods.engine.guard import needs_cudnn_off
from tests import zoo


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    c = zoo.by_name("mlp")
    assert isinstance(c.inputs, torch.Tensor)
    return c.model, c.inputs


@pytest.mark.parametrize(
    ("kwargs", "error", "argument", "words"),
    [
        ({"method": "integrated_gradient"}, methods.UnknownMethodError, "method",
         "integrated_gradients"),
        ({"method": "saliency", "n_steps": 3}, methods.UnknownParameterError, "n_steps", "abs"),
        ({"method": "integrated_gradients", "n_steps": 0}, methods.InvalidArgumentError,
         "n_steps", ">= 1"),
        ({"method": "integrated_gradients", "target": 0, "n_steps": True},
         methods.InvalidTypeError, "n_steps", "not a bool"),
        ({"method": "lime", "target": 0, "n_samples": False}, methods.InvalidTypeError,
         "n_samples", "not a bool"),
        ({"method": "integrated_gradients", "approximation_method": "simpson"},
         methods.InvalidArgumentError, "approximation_method", "gausslegendre"),
        ({"method": "saliency", "target": 3}, methods.TargetError, "target", "out of range"),
        ({"method": "saliency", "target": [0, 1]}, methods.TargetError, "target", "4 examples"),
        ({"method": "saliency", "target": [0, 1, 2, 7]}, methods.TargetError, "target",
         "example 3"),
        ({"method": "saliency", "target": None}, methods.TargetError, "target", "pass a target"),
        ({"method": "saliency", "target": (0, 1)}, methods.TargetError, "target", "2 indices"),
        ({"method": "saliency", "target": 1.5}, methods.TargetError, "target", "float"),
        ({"method": "integrated_gradients", "target": 0, "baselines": torch.zeros(2, 6)},
         methods.BaselineError, "baselines", "does not broadcast"),
        ({"method": "integrated_gradients", "target": 0, "baselines": (0.0, 1.0)},
         methods.BaselineError, "baselines", "one baseline per input"),
        ({"method": "gradient_shap", "target": 0}, methods.BaselineError, "baselines",
         "needs baselines"),
        ({"method": "saliency", "target": 0, "return_convergence_delta": True},
         methods.InvalidArgumentError, "return_convergence_delta", "no convergence delta"),
        ({"method": "saliency", "target": 0, "internal_batch_size": 0},
         methods.InvalidArgumentError, "internal_batch_size", ">= 1"),
        ({"method": "saliency", "target": 0, "noise_tunnel": {"nt_type": "smooth"}},
         methods.InvalidArgumentError, "noise_tunnel.nt_type", "smoothgrad"),
        ({"method": "saliency", "target": 0, "noise_tunnel": {"nt_samples": 0}},
         methods.InvalidArgumentError, "noise_tunnel.nt_samples", "greater than or equal"),
    ],
)  # fmt: skip
def test_errors_name_the_argument(
    kwargs: dict[str, Any], error: type[Exception], argument: str, words: str
) -> None:
    model, x = _mlp()
    kwargs = dict(kwargs)
    method = kwargs.pop("method")
    with pytest.raises(error, match=words) as info:
        methods.attribute(model, x, method, **kwargs)
    assert isinstance(info.value, methods.AttributionError)
    assert info.value.argument == argument
    assert isinstance(info.value, (ValueError, TypeError))


def test_integer_inputs_to_a_gradient_method_are_refused() -> None:
    emb = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(methods.InvalidTypeError, match="layer_integrated_gradients") as info:
        methods.attribute(emb, ids, "integrated_gradients", target=0)
    assert info.value.argument == "inputs"


def test_inputs_with_different_batch_sizes_are_refused() -> None:
    c = zoo.by_name("two_input")
    x1, x2 = c.inputs
    with pytest.raises(methods.InvalidArgumentError, match="same number of examples"):
        methods.attribute(c.model, (x1, x2[:2]), "saliency", target=0)


def test_model_errors_are_reported_as_model_errors() -> None:
    model, x = _mlp()
    with pytest.raises(methods.ModelError, match="the model raised RuntimeError"):
        methods.attribute(model, x[:, :5], "saliency", target=0)


def test_non_tensor_outputs_are_refused_clearly() -> None:
    with pytest.raises(methods.InvalidTypeError, match="must return a Tensor"):
        methods.attribute(lambda x: {"logits": x}, torch.ones(2, 3), "saliency", target=0)


@pytest.mark.parametrize("compile_", ["script", "trace"])
def test_torchscript_hook_free_methods_work_and_hook_methods_refuse(compile_: str) -> None:
    model, x = _mlp()
    jit = torch.jit.script(model) if compile_ == "script" else torch.jit.trace(model, x)
    for name in ("saliency", "input_x_gradient", "integrated_gradients"):
        ours = methods.attribute(jit, x, name, target=1).attributions
        eager = methods.attribute(model, x, name, target=1).attributions
        torch.testing.assert_close(ours, eager)
    for name in ("deeplift", "guided_backprop", "deconvolution"):
        with pytest.raises(methods.UnsupportedModelError, match=f"{name} needs to intercept"):
            methods.attribute(jit, x, name, target=1)


def test_plain_callables_work() -> None:
    model, x = _mlp()
    ours = methods.attribute(lambda t: model(t)[:, 2], x, "integrated_gradients")
    ref = methods.attribute(model, x, "integrated_gradients", target=2)
    torch.testing.assert_close(ours.attributions, ref.attributions)


class _SmallMemoryModel(nn.Module):
    """Pretends to run out of memory above a batch size, as a GPU would."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 3).double()
        self.limit = limit
        self.batches: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batches.append(x.shape[0])
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return self.lin(x)


def test_auto_batch_size_halves_and_retries_on_out_of_memory() -> None:
    x = torch.randn(4, 6, dtype=torch.float64)
    model = _SmallMemoryModel(limit=40)
    ref = methods.attribute(model.lin, x, "integrated_gradients", target=0, n_steps=50)
    r = methods.attribute(model, x, "integrated_gradients", target=0, n_steps=50,
                          internal_batch_size="auto")  # fmt: skip
    torch.testing.assert_close(r.attributions, ref.attributions)
    assert r.params["internal_batch_size"] <= 40
    assert max(b for b in model.batches if b <= 40) <= 40


def test_memory_budget_follows_the_device_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, the budget is 1 GiB on the CPU and half a CUDA device's free memory (never under
    1 GiB); set, it is what was set on every device."""
    free = {"bytes": 80 << 30}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 96 << 30))
    cuda = torch.device("cuda", 0)
    assert methods.memory_budget() == methods.memory_budget(torch.device("cpu")) == 1 << 30
    assert methods.memory_budget(cuda) == 40 << 30
    free["bytes"] = 1 << 20
    assert methods.memory_budget(cuda) == 1 << 30
    try:
        methods.set_memory_budget(3 << 20)
        assert methods.memory_budget(cuda) == methods.memory_budget() == 3 << 20
    finally:
        methods.set_memory_budget(None)
    assert methods.memory_budget(cuda) == 1 << 30
    with pytest.raises(methods.InvalidArgumentError, match="positive"):
        methods.set_memory_budget(0)


def test_auto_batch_size_follows_the_memory_budget() -> None:
    model, x = _mlp()
    try:
        methods.set_memory_budget(1 << 16)
        small = methods.attribute(model, x, "integrated_gradients", target=0,
                                  internal_batch_size="auto")  # fmt: skip
        methods.set_memory_budget(1 << 30)
        large = methods.attribute(model, x, "integrated_gradients", target=0,
                                  internal_batch_size="auto")  # fmt: skip
    finally:
        methods.set_memory_budget(None)  # by device again
    assert small.params["internal_batch_size"] < large.params["internal_batch_size"] == 200
    torch.testing.assert_close(small.attributions, large.attributions)


def test_fixed_oom_without_auto_propagates() -> None:
    x = torch.randn(4, 6, dtype=torch.float64)
    with pytest.raises(torch.OutOfMemoryError):
        methods.attribute(_SmallMemoryModel(limit=40), x, "integrated_gradients", target=0)


def test_cudnn_is_switched_off_only_for_recurrent_models_on_cuda() -> None:
    lstm = nn.LSTM(3, 4)
    assert not needs_cudnn_off(lstm)  # CPU: nothing to do
    assert not needs_cudnn_off(nn.Linear(3, 3))


class _LSTMClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 5, batch_first=True)
        self.fc = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def test_recurrent_models_in_eval_mode() -> None:
    torch.manual_seed(0)
    model = _LSTMClassifier().double().eval()
    x = torch.randn(2, 4, 3, dtype=torch.float64)
    r = methods.attribute(model, x, "integrated_gradients", target=1, return_convergence_delta=True)
    assert float(r.convergence_delta.abs().max()) < 1e-3
    assert not model.training


def test_seeded_stochastic_runs_are_reproducible_and_do_not_touch_the_global_rng() -> None:
    model, x = _mlp()
    dist = torch.randn(3, 6, dtype=torch.float64)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = methods.attribute(model, x, "gradient_shap", target=0, baselines=dist, seed=5, stdevs=0.2)
    assert torch.equal(state, torch.get_rng_state())
    b = methods.attribute(model, x, "gradient_shap", target=0, baselines=dist, seed=5, stdevs=0.2)
    c = methods.attribute(model, x, "gradient_shap", target=0, baselines=dist, seed=6, stdevs=0.2)
    assert torch.equal(a.attributions, b.attributions)
    assert not torch.equal(a.attributions, c.attributions)


def test_gradient_shap_with_one_baseline_on_a_linear_model_equals_ig() -> None:
    torch.manual_seed(1)
    lin = nn.Linear(5, 2).double()
    x = torch.randn(3, 5, dtype=torch.float64)
    b = torch.randn(1, 5, dtype=torch.float64)
    gs = methods.attribute(lin, x, "gradient_shap", target=1, baselines=b, seed=0, n_samples=7,
                           internal_batch_size=4, return_convergence_delta=True)  # fmt: skip
    ig = methods.attribute(lin, x, "integrated_gradients", target=1, baselines=b)
    torch.testing.assert_close(gs.attributions, ig.attributions)
    assert gs.convergence_delta.shape == (21,)
    assert float(gs.convergence_delta.abs().max()) < 1e-10


def test_noise_tunnel_without_noise_equals_the_base_method() -> None:
    model, x = _mlp()
    base = methods.attribute(model, x, "deeplift", target=0).attributions
    nt = methods.attribute(model, x, "deeplift", target=0,
                           noise_tunnel={"nt_samples": 3, "stdevs": 0.0}).attributions  # fmt: skip
    torch.testing.assert_close(nt, base)


def test_noise_tunnel_draws_baselines_from_the_distribution() -> None:
    model, x = _mlp()
    dist = torch.randn(5, 6, dtype=torch.float64)
    r = methods.attribute(model, x, "integrated_gradients", target=0, baselines=dist, seed=1,
                          return_convergence_delta=True, n_steps=10,
                          noise_tunnel={"nt_samples": 4, "stdevs": 0.1,
                                        "draw_baseline_from_distrib": True})  # fmt: skip
    assert r.attributions.shape == x.shape
    assert r.convergence_delta.shape == (16,)


@pytest.mark.parametrize("width", [1, 20, 62, 63, 150])
def test_distinct_rows_equals_unique_over_rows(width: int) -> None:
    # The packed sort must give unique(dim=0)'s order: it decides the chunks, hence rounding.
    from methods.engine.coalitions import distinct_rows

    g = torch.Generator().manual_seed(width)
    rows = torch.rand(200, width, generator=g) > 0.5
    rows = rows[torch.randint(0, 200, (300,), generator=g)]
    expected, expected_inverse = torch.unique(rows.to(torch.uint8), dim=0, return_inverse=True)
    got, inverse = distinct_rows(rows)
    assert got.dtype == torch.bool
    assert torch.equal(got, expected.bool())
    assert torch.equal(inverse, expected_inverse)


def test_auto_batch_size_counts_what_a_row_costs_not_the_weights() -> None:
    """A wide layer's weight (1 MiB, saved by its backward as a transposed view) is not per
    row: a row costs its activations (~4 KiB here: the input and the tanh's output, float32),
    so a budget for ~100 rows gets about 100, not one (issue 37: one row per chunk on
    BERT-base)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 2)).eval()
    x = torch.randn(4, 512)
    row = 2 * 512 * 4  # bytes a row keeps for backward
    try:
        methods.set_memory_budget(3 * row * 100)
        r = methods.attribute(
            model, x, "integrated_gradients", target=0, internal_batch_size="auto"
        )
    finally:
        methods.set_memory_budget(None)  # by device again
    assert 50 <= r.params["internal_batch_size"] <= 200


def test_a_target_out_of_range_names_each_example_s_output_shape() -> None:
    """Not the shape of the rows integrated gradients runs (examples x n_steps)."""
    from methods.errors import TargetError

    model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Unflatten(1, (4, 3)))
    x = torch.randn(2, 6)
    for target in [(5, 1), [(0, 1), (7, 2)]]:
        with pytest.raises(TargetError) as err:
            methods.attribute(model, x, "integrated_gradients", target=target, n_steps=50)
        assert "(4, 3)" in str(err.value) and "(100" not in str(err.value), str(err.value)


def test_a_negative_target_counts_from_the_end_as_in_captum() -> None:
    """The engine keeps Captum's (Python's) indexing: ``target=-1`` is the last class, in every
    form; below ``-size`` is out of range. Only the HTTP API refuses a target below 0
    (CONTRACT 9.1, ``service.wire.targets``)."""
    from captum.attr import Saliency

    from methods.errors import TargetError

    model, x = _mlp()
    classes = model(x).shape[1]
    last = classes - 1
    got = methods.attribute(model, x, "saliency", target=-1).attributions
    torch.testing.assert_close(
        got, methods.attribute(model, x, "saliency", target=last).attributions
    )
    torch.testing.assert_close(got, Saliency(model).attribute(x, target=-1))
    rows = [-1, 0] * (x.shape[0] // 2)
    want = methods.attribute(model, x, "saliency", target=[r % classes for r in rows])
    got_rows = methods.attribute(model, x, "saliency", target=rows)
    torch.testing.assert_close(got_rows.attributions, want.attributions)
    with pytest.raises(TargetError, match="out of range") as err:
        methods.attribute(model, x, "saliency", target=-classes - 1)
    assert err.value.argument == "target"
