"""``progress=True`` (CONTRACT §7.7, Captum's ``show_progress``): a tqdm bar on stderr that
counts every evaluation of a multi-step method to its end; nothing without it."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn

import methods

CASES: list[tuple[str, dict[str, Any], int]] = [
    # (method, params, evaluations at least)
    ("integrated_gradients", {"n_steps": 20, "internal_batch_size": 8}, 20),
    ("feature_ablation", {"perturbations_per_eval": 1}, 6),
    ("occlusion", {"sliding_window_shapes": (2,)}, 5),
    ("shapley_value_sampling", {"n_samples": 3}, 12),  # repeated coalitions run once
    ("lime", {"n_samples": 30, "perturbations_per_eval": 4}, 30),
    ("kernel_shap", {"n_samples": 30}, 25),
    ("feature_permutation", {}, 6),
    ("layer_conductance", {"layer": "0", "n_steps": 10}, 10),
    ("neuron_feature_ablation", {"layer": "0", "neuron_selector": 1}, 6),
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))


def _counts(err: str) -> tuple[int, int]:
    """The bar's last ``done/total``."""
    found = re.findall(r"(\d+)/(\d+)", err)
    assert found, f"no progress bar on stderr: {err!r}"
    done, total = found[-1]
    return int(done), int(total)


@pytest.mark.parametrize(("method", "params", "least"), CASES)
def test_the_bar_counts_every_evaluation_to_the_end(
    capsys: pytest.CaptureFixture[str], method: str, params: dict[str, Any], least: int
) -> None:
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1))
    target = None if method.startswith("neuron") else 1
    quiet = methods.attribute(_model(), x, method, target=target, seed=0, **params)
    assert capsys.readouterr().err == ""
    shown = methods.attribute(_model(), x, method, target=target, seed=0, progress=True,
                              **params)  # fmt: skip
    done, total = _counts(capsys.readouterr().err)
    assert done == total >= least
    torch.testing.assert_close(shown.attributions, quiet.attributions)  # the bar changes nothing


def test_a_noise_tunnel_grows_the_total_as_it_goes(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(2, 6)
    nt = {"nt_type": "smoothgrad", "nt_samples": 4, "nt_samples_batch_size": 1}
    methods.attribute(_model(), x, "integrated_gradients", target=0, n_steps=5,
                      noise_tunnel=nt, seed=0, progress=True)  # fmt: skip
    done, total = _counts(capsys.readouterr().err)
    assert done == total == 4 * 5  # 4 samples of 5 path steps each


def test_progress_must_be_a_bool() -> None:
    with pytest.raises(methods.InvalidTypeError) as e:
        methods.attribute(_model(), torch.randn(1, 6), "saliency", target=0, progress="yes")
    assert e.value.argument == "progress"
