"""Arguments that make any registered method runnable on a model-matrix case.

Derived from the method's params schema and kind, so a new method enters the conformance
suite the moment it is registered; only genuinely method-specific needs are listed here.
"""

from __future__ import annotations

from typing import Any

import torch

from methods.registry import MethodSpec
from tests import zoo


def _xs(case: zoo.Case) -> tuple[torch.Tensor, ...]:
    return case.inputs if isinstance(case.inputs, tuple) else (case.inputs,)


def _layer_output(case: zoo.Case, layer: str) -> torch.Tensor:
    captured: list[torch.Tensor] = []
    module = case.model.get_submodule(layer)
    handle = module.register_forward_hook(lambda m, i, o: captured.append(o))
    try:
        with torch.no_grad():
            case.model(*_xs(case), *(case.additional_forward_args or ()))
    finally:
        handle.remove()
    return captured[0]


def kwargs_for(spec: MethodSpec, case: zoo.Case) -> dict[str, Any]:
    fields = spec.params.model_fields
    kw: dict[str, Any] = {
        "target": case.target,
        "additional_forward_args": case.additional_forward_args,
    }
    if spec.baseline_distribution:
        g = torch.Generator().manual_seed(0)
        dist = tuple(torch.randn((2, *x.shape[1:]), generator=g, dtype=x.dtype) for x in _xs(case))
        kw["baselines"] = dist if isinstance(case.inputs, tuple) else dist[0]
    elif case.baselines is not None and spec.family != "layer" and spec.name != "blur_ig":
        kw["baselines"] = case.baselines
    if "layer" in fields and case.layers:
        kw["layer"] = case.layers[0]
    if "neuron_selector" in fields and case.layers:
        out = _layer_output(case, case.layers[0])
        kw["neuron_selector"] = (0,) * (out.dim() - 1)
    if "sliding_window_shapes" in fields:
        kw["sliding_window_shapes"] = tuple(tuple([1] * (x.dim() - 1)) for x in _xs(case))
        if not isinstance(case.inputs, tuple):
            kw["sliding_window_shapes"] = kw["sliding_window_shapes"][0]
    if "n_samples" in fields:
        kw["n_samples"] = 6
    if "n_steps" in fields:
        kw["n_steps"] = 8
    return kw


def applicable(spec: MethodSpec, case: zoo.Case) -> bool:
    fields = spec.params.model_fields
    if ("layer" in fields) and not case.layers:
        return False
    if spec.images_only and (len(_xs(case)) != 1 or _xs(case)[0].dim() not in (3, 4)):
        return False  # blur_ig, xrai: one image input
    if spec.name == "feature_permutation" and _xs(case)[0].shape[0] < 2:
        return False
    return not (spec.name == "shapley_values" and sum(x[0].numel() for x in _xs(case)) > 8)
