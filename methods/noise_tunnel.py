"""NoiseTunnel: SmoothGrad, SmoothGrad-squared and VarGrad over any registered method.

Smilkov et al. 2017 (https://arxiv.org/abs/1706.03825); Adebayo et al. 2018 (VarGrad).
Each example is repeated ``nt_samples`` times (copies kept together, as Captum does), Gaussian
noise of standard deviation ``stdevs`` is added, the wrapped method runs on the noisy batch and
the results are averaged (or their square / variance) per example.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, ValidationError
from torch import Tensor

from methods.cancel import checkpoint
from methods.engine.call import Call, Output
from methods.engine.inputs import Tensors
from methods.errors import BaselineError, InvalidArgumentError, InvalidTypeError
from methods.params import MethodParams, NonNegativeFloat, check_values
from methods.registry import MethodSpec


class NoiseTunnelParams(MethodParams):
    """Noise tunnel parameters (Captum's names and defaults)."""

    nt_type: Literal["smoothgrad", "smoothgrad_sq", "vargrad"] = "smoothgrad"
    nt_samples: int = Field(5, ge=1, description="noisy samples per example")
    stdevs: NonNegativeFloat | tuple[NonNegativeFloat, ...] = Field(
        1.0, description="noise standard deviation, one for all inputs or one per input"
    )
    nt_samples_batch_size: int | None = Field(
        None, ge=1, description="samples per example evaluated in one call (None: all)"
    )
    draw_baseline_from_distrib: bool = Field(
        False, description="draw each noisy sample's baseline at random from the baseline rows"
    )


def parse_noise_tunnel(raw: dict[str, Any]) -> NoiseTunnelParams:
    if not isinstance(raw, dict):
        raise InvalidArgumentError(
            f"noise_tunnel must be a dict of noise tunnel parameters, got {type(raw).__name__}",
            argument="noise_tunnel",
        )
    try:
        check_values(NoiseTunnelParams, raw, "noise_tunnel: ")
    except InvalidTypeError as exc:
        raise InvalidTypeError(str(exc), argument=f"noise_tunnel.{exc.argument}") from None
    try:
        return NoiseTunnelParams.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(p) for p in err["loc"])
        raise InvalidArgumentError(
            f"noise_tunnel.{name}: {err['msg']}", argument=f"noise_tunnel.{name}"
        ) from None


def _stdevs(nt: NoiseTunnelParams, n_inputs: int) -> tuple[float, ...]:
    if isinstance(nt.stdevs, tuple):
        if len(nt.stdevs) != n_inputs:
            raise InvalidArgumentError(
                f"noise_tunnel.stdevs has {len(nt.stdevs)} entries for {n_inputs} inputs",
                argument="noise_tunnel.stdevs",
            )
        values = nt.stdevs
    else:
        values = (nt.stdevs,) * n_inputs
    if any(s < 0 for s in values):
        raise InvalidArgumentError(
            "noise_tunnel.stdevs must be >= 0", argument="noise_tunnel.stdevs"
        )
    return tuple(float(s) for s in values)


def _interleave_per_example(value: Any, n: int, k: int) -> Any:
    """Repeat per-example tensors (dim 0 == n > 1) k times, copies together."""
    if isinstance(value, Tensor) and value.dim() >= 1 and n > 1 and value.shape[0] == n:
        return value.repeat_interleave(k, dim=0)
    if isinstance(value, tuple):
        return tuple(_interleave_per_example(v, n, k) for v in value)
    return value


def _baselines(call: Call, nt: NoiseTunnelParams, k: int) -> Any:
    if not nt.draw_baseline_from_distrib or call.baselines is None:
        # without baselines there is nothing to draw from: the method keeps its default, as
        # in Captum. A list gives one baseline per input, as a tuple does (format_baselines).
        per_input = tuple(call.baselines) if isinstance(call.baselines, list) else call.baselines
        return _interleave_per_example(per_input, call.n, k)
    from methods.engine.baselines import format_baseline_distribution

    dist = format_baseline_distribution(call.baselines, call.inputs, "draw_baseline_from_distrib")
    rows = dist[0].shape[0]
    if rows < 1:
        raise BaselineError("no baseline rows to draw from", argument="baselines")
    idx = call.randint(rows, (call.n * k,), dist[0].device)
    drawn = tuple(b[idx] for b in dist)
    return drawn if len(drawn) > 1 else drawn[0]


def run_noise_tunnel(
    spec: MethodSpec, call: Call, p: MethodParams, raw: dict[str, Any]
) -> tuple[Output, dict[str, Any]]:
    nt = parse_noise_tunnel(raw)
    stdevs = _stdevs(nt, len(call.inputs))
    for i, x in enumerate(call.inputs):
        if stdevs[i] > 0 and not x.is_floating_point():
            raise InvalidArgumentError(
                f"noise_tunnel adds Gaussian noise but inputs[{i}] has dtype {x.dtype}",
                argument="noise_tunnel.stdevs",
            )
    n = call.n
    per = nt.nt_samples_batch_size or nt.nt_samples
    sizes = [per] * (nt.nt_samples // per) + ([nt.nt_samples % per] if nt.nt_samples % per else [])
    p_fields = p.model_dump()
    total: list[Tensor] | None = None
    total_sq: list[Tensor] | None = None
    deltas: list[Tensor] = []
    as_tuple: bool | None = None
    echo: dict[str, Any] = {}
    for k in sizes:
        checkpoint()
        noisy: Tensors = tuple(
            x.repeat_interleave(k, dim=0)
            + (call.randn((n * k, *x.shape[1:]), x) * s if s > 0 else 0)
            for x, s in zip(call.inputs, stdevs, strict=True)
        )
        sub = call.replace(
            inputs=noisy,
            target=call.target.expand(k, interleave=True),
            forward=call.forward.expanded(k, interleave=True),
            baselines=_baselines(call, nt, k),
        )
        changed = {f: _interleave_per_example(v, n, k) for f, v in p_fields.items()}
        sub_p = p.model_copy(update=changed) if changed else p
        out = spec.fn(sub, sub_p)
        as_tuple, echo = out.as_tuple, out.echo
        parts = [a.reshape(n, k, *a.shape[1:]) for a in out.attributions]
        s1 = [a.sum(1) for a in parts]
        s2 = [(a * a).sum(1) for a in parts]
        total = s1 if total is None else [t + s for t, s in zip(total, s1, strict=True)]
        total_sq = s2 if total_sq is None else [t + s for t, s in zip(total_sq, s2, strict=True)]
        if out.delta is not None:
            deltas.append(out.delta.reshape(-1))
    if total is None or total_sq is None:
        raise InvalidArgumentError("noise_tunnel.nt_samples must be >= 1", argument="noise_tunnel")
    mean = [t / nt.nt_samples for t in total]
    mean_sq = [t / nt.nt_samples for t in total_sq]
    if nt.nt_type == "smoothgrad":
        attrs = mean
    elif nt.nt_type == "smoothgrad_sq":
        attrs = mean_sq
    else:
        attrs = [m2 - m * m for m, m2 in zip(mean, mean_sq, strict=True)]
    # Captum concatenates each partition's deltas in turn (example-major within a partition)
    delta = torch.cat(deltas) if deltas else None
    nt_echo = nt.model_dump()
    return Output(tuple(attrs), delta=delta, echo=echo, as_tuple=as_tuple), nt_echo
