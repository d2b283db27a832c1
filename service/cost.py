"""Estimated cost of a request, in forward rows: what limits and batch caps are measured in."""

from __future__ import annotations

from typing import Any

import numpy as np

#: methods whose cost scales with n_steps (points along a path)
PATH = frozenset(
    {
        "integrated_gradients",
        "layer_integrated_gradients",
        "layer_conductance",
        "internal_influence",
        "neuron_integrated_gradients",
        "neuron_conductance",
    }
)
#: methods whose cost scales with n_samples
SAMPLED = frozenset(
    {"gradient_shap", "layer_gradient_shap", "neuron_gradient_shap", "kernel_shap", "lime"}
)
#: perturbation methods that evaluate each feature (group) once
PER_FEATURE = frozenset(
    {"feature_ablation", "feature_permutation", "layer_feature_ablation", "neuron_feature_ablation"}
)
AUTO_STEPS = 512  # the top of IG's n_steps="auto" ladder


def _features(arrays: tuple[np.ndarray, ...], params: dict[str, Any]) -> int:
    mask = params.get("feature_mask")
    if isinstance(mask, np.ndarray):
        return int(np.unique(mask).size)
    if isinstance(mask, (list, tuple)) and all(isinstance(m, np.ndarray) for m in mask):
        return int(np.unique(np.concatenate([m.ravel() for m in mask])).size)
    return sum(int(np.prod(a.shape[1:])) for a in arrays) if arrays else 512


def _windows(arrays: tuple[np.ndarray, ...], params: dict[str, Any]) -> int:
    shapes = params.get("sliding_window_shapes")
    strides = params.get("strides")
    if not arrays or not isinstance(shapes, (list, tuple)) or not shapes:
        return _features(arrays, params)
    if isinstance(shapes[0], int):
        shapes, strides = [shapes], [strides]
    total = 0
    for i, a in enumerate(arrays[: len(shapes)]):
        win = shapes[i]
        st = strides[i] if isinstance(strides, (list, tuple)) and i < len(strides) else 1
        count = 1
        for d, w in enumerate(win):
            size = a.shape[1 + d] if 1 + d < a.ndim else 1
            s = st[d] if isinstance(st, (list, tuple)) and d < len(st) else (st or 1)
            count *= max(1, (size - int(w)) // max(1, int(s)) + 1)
        total += count
    return total


def per_example(
    method: str,
    params: dict[str, Any],
    arrays: tuple[np.ndarray, ...],
    noise_tunnel: dict[str, Any] | None,
    return_delta: bool,
    n_baselines: int = 1,
) -> int:
    """Forward rows one example costs (an estimate: forward+backward counted as one row)."""
    if method in PATH:
        steps = params.get("n_steps", 50)
        rows = AUTO_STEPS if steps == "auto" else int(steps)
        rows += 2 if return_delta else 0
    elif method in SAMPLED:
        rows = int(params.get("n_samples", 5 if "shap" in method else 50))
    elif method in PER_FEATURE:
        rows = _features(arrays, params) + 1
    elif method == "occlusion":
        rows = _windows(arrays, params) + 1
    elif method == "shapley_value_sampling":
        rows = int(params.get("n_samples", 25)) * (_features(arrays, params) + 1)
    elif method == "shapley_values":
        rows = 2 ** min(_features(arrays, params), 62)
    elif method in ("deeplift_shap", "layer_deeplift_shap", "neuron_deeplift_shap"):
        rows = 2 * max(1, n_baselines)
    else:
        rows = 1
    if noise_tunnel:
        rows *= int(noise_tunnel.get("nt_samples", 5))
    return max(1, rows)
