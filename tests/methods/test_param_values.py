"""One rule for every numeric parameter of every method and of the noise tunnel: pydantic's lax
mode would read ``True`` as 1, ``" 50 "`` and ``"5_0"`` as 50, and accept NaN or ``1e999``
(infinity); each is a typed error naming the parameter. Generated from the registry, so a new
method's parameters are covered the moment it exists."""

from __future__ import annotations

from typing import Any

import pytest

from methods import registry
from methods.errors import InvalidTypeError
from methods.noise_tunnel import NoiseTunnelParams, parse_noise_tunnel
from methods.params import _scalars, parse_params

NOT_NUMBERS: list[Any] = [True, " 50 ", "5_0", float("nan"), float("inf")]


def _numeric_fields() -> list[tuple[str, str]]:
    out = []
    for ms in registry.specs():
        for name, field in ms.params.model_fields.items():
            numbers, strings, _ = _scalars(field.annotation)
            if numbers and not strings:
                out.append((ms.name, name))
    return out


FIELDS = _numeric_fields()


def test_the_rule_covers_the_fields_that_matter() -> None:
    assert ("integrated_gradients", "n_steps") in FIELDS
    assert ("shapley_value_sampling", "n_samples") in FIELDS
    assert all(name != "layer" for _, name in FIELDS)  # strings stay strings


@pytest.mark.parametrize(("method", "name"), FIELDS)
@pytest.mark.parametrize("value", NOT_NUMBERS, ids=repr)
def test_not_a_number_is_refused_for_every_numeric_param(
    method: str, name: str, value: Any
) -> None:
    ms = registry.get(method)
    field = ms.params.model_fields[name]
    if isinstance(value, bool) and field.annotation is bool:
        pytest.skip("a flag")
    with pytest.raises(InvalidTypeError) as e:
        parse_params(ms.params, method, {name: value})
    assert e.value.argument in (name, f"{name}.0") and name in str(e.value)


@pytest.mark.parametrize(
    ("raw", "argument"),
    [
        ({"nt_samples": True}, "noise_tunnel.nt_samples"),
        ({"nt_samples": "3"}, "noise_tunnel.nt_samples"),
        ({"stdevs": float("nan")}, "noise_tunnel.stdevs"),
        ({"stdevs": 1e999}, "noise_tunnel.stdevs"),
        ({"stdevs": [0.1, float("nan")]}, "noise_tunnel.stdevs.1"),
    ],
)
def test_the_noise_tunnel_takes_the_same_rule(raw: dict[str, Any], argument: str) -> None:
    with pytest.raises(InvalidTypeError) as e:
        parse_noise_tunnel(raw)
    assert e.value.argument == argument


def test_numbers_and_named_options_still_pass() -> None:
    ig = registry.get("integrated_gradients")
    assert parse_params(ig.params, "integrated_gradients", {"n_steps": "auto"}).n_steps == "auto"
    assert parse_params(ig.params, "integrated_gradients", {"n_steps": 7}).n_steps == 7
    nt = parse_noise_tunnel({"nt_samples": 3, "stdevs": [0.1, 0.2]})
    assert isinstance(nt, NoiseTunnelParams) and nt.stdevs == (0.1, 0.2)
