"""Check an attribution against the same attribution in float64 on the CPU.

An attribution served from a GPU, in half precision, or through a compiled model can be
silently wrong in ways no unit test on a developer's CPU sees (a kernel that differs on one
device only; bfloat16's 8-bit mantissa through a long path integral). ``verify`` computes
the attribution as the model is served and again on a float64 CPU copy of the model, and
reports how far apart they are, with a tolerance that depends on the served dtype.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from methods import registry
from methods.api import attribute
from methods.engine.call import Result
from methods.errors import InvalidArgumentError, UnsupportedModelError

#: relative tolerance (max |a - r| / max |r|) for attributions computed in each dtype
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-7,
    torch.float32: 1e-3,
    torch.float16: 2e-2,
    torch.bfloat16: 1e-1,
}


@dataclass(frozen=True)
class Verification:
    """How far an attribution is from its float64 CPU reference."""

    max_abs_diff: float
    max_rel_diff: float  # max |a - r| / max |r|, per attribution tensor
    tolerance: float
    reference: str = "cpu-float64"

    @property
    def ok(self) -> bool:
        return self.max_rel_diff <= self.tolerance

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_abs_diff": self.max_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "tolerance": self.tolerance,
            "reference": self.reference,
            "ok": self.ok,
        }


def reference_model(model: Any) -> Any:
    """A float64 CPU copy of ``model`` (the caller's model is not touched)."""
    if isinstance(model, torch.export.ExportedProgram) or not isinstance(model, nn.Module):
        raise UnsupportedModelError(
            f"a {type(model).__name__} cannot be copied to float64 on the CPU; device checks "
            "need an nn.Module or a TorchScript module",
            argument="model",
        )
    ref = copy.deepcopy(model)
    return ref.to(device="cpu", dtype=torch.float64)


def to_reference(value: Any) -> Any:
    """Tensors moved to the CPU, floating ones in float64; containers kept."""
    if isinstance(value, Tensor):
        value = value.detach().cpu()
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(to_reference(v) for v in value)
    if isinstance(value, dict):
        return {k: to_reference(v) for k, v in value.items()}
    return value


def compare(result: Result, reference: Result) -> Verification:
    """The distance between ``result``'s attributions and ``reference``'s."""
    got, ref = _flat(result.attributions), _flat(reference.attributions)
    abs_diff = rel_diff = 0.0
    dtype = got[0].dtype if got else torch.float32
    for a, r in zip(got, ref, strict=True):
        a64, r64 = a.detach().cpu().double(), r.detach().double()
        d = float((a64 - r64).abs().max()) if a64.numel() else 0.0
        scale = float(r64.abs().max()) if r64.numel() else 0.0
        abs_diff = max(abs_diff, d)
        rel_diff = max(rel_diff, d / scale if scale > 0 else (0.0 if d == 0 else float("inf")))
        dtype = a.dtype if TOLERANCE.get(a.dtype, 0) > TOLERANCE.get(dtype, 0) else dtype
    return Verification(abs_diff, rel_diff, TOLERANCE.get(dtype, 1e-3))


def verify(
    model: Any,
    inputs: Any,
    method: str,
    /,
    reference: Any = None,
    **kwargs: Any,
) -> tuple[Result, Verification]:
    """``methods.attribute(model, inputs, method, **kwargs)`` and its distance from the same
    attribution on a float64 CPU copy of the model (``reference``, if given, is that copy:
    a server keeps one per model rather than copying per request). Stochastic methods are
    refused: their samples are drawn in the working dtype and would differ."""
    spec = registry.get(method)
    if spec.stochastic or kwargs.get("noise_tunnel") is not None:
        raise InvalidArgumentError(
            f"{method} draws random samples in the working dtype, so a float64 reference "
            "would draw different ones; verify a deterministic method",
            argument="verify",
        )
    ref_model = reference_model(model) if reference is None else reference
    result = attribute(model, inputs, method, **kwargs)
    ref = attribute(ref_model, to_reference(inputs), method, **to_reference(kwargs))
    return result, compare(result, ref)


def _flat(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    out: list[Tensor] = []
    for v in value:
        out.extend(_flat(v))
    return out
