"""Request checks every kind of model shares (server side, before any work): the method and its
params, the server's limits, batch sizes, the noise tunnel and raw texts.

What a method can do is read off its registry entry (``MethodSpec``); no method names are
listed here.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from methods import registry
from methods.engine import superpixels
from methods.errors import AttributionError
from methods.noise_tunnel import parse_noise_tunnel
from methods.params import MethodParams, parse_params
from methods.registry import MethodSpec
from model_registry.spec import ModelSpec
from service.core.errors import InvalidRequest, LimitExceeded, UnknownMethod
from service.core.settings import Settings
from service.wire import codec
from service.wire.attributions import REQUEST_FIELDS, AttributionRequest
from service.wire.engine_errors import from_engine

#: characters a text may hold per allowed token before it is refused unread (long words)
MAX_CHARS_PER_TOKEN = 32


def method_spec(name: str) -> MethodSpec:
    """The registry entry of ``name``; 404 (with close names) when there is none."""
    try:
        return registry.get(name)
    except AttributionError as exc:  # UnknownMethodError: pointing at GET /v1/methods
        err = from_engine(exc)
        raise UnknownMethod(err.detail, loc=("body", "method")) from None


def check_param_names(ms: MethodSpec, params: dict[str, Any]) -> None:
    """Request fields put inside ``params``, Captum's IG ``method=``, Python-only params."""
    for name in params:
        loc = ("body", "params", name)
        if name in REQUEST_FIELDS or name == "additional_forward_args":
            raise InvalidRequest(
                f"{name} is a field of the request body, not a method parameter: move it out "
                f'of "params" to the top level ("{name}": ...)',
                loc=loc,
            )
        if name == "method":
            if "approximation_method" in ms.params.model_fields:
                raise InvalidRequest(
                    "params.method is Captum's name for the quadrature rule; here it is "
                    'params.approximation_method ("gausslegendre", "riemann_left", '
                    '"riemann_right", "riemann_middle", "riemann_trapezoid")',
                    loc=loc,
                )
            raise InvalidRequest(
                'the method is the request\'s top-level "method" field, not a parameter',
                loc=loc,
            )
        if name in ms.python_only_params:
            raise InvalidRequest(
                f"{ms.name}: parameter {name!r} takes a Python callable and is available only "
                "through the Python API (methods.attribute), not over HTTP",
                loc=loc,
            )


def decode_params(ms: MethodSpec, raw: dict[str, Any], settings: Settings) -> dict[str, Any]:
    """Method params with tensor-valued ones decoded (nested lists or base64, or one per input)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        loc = ("body", "params", name)
        tensor = name in ms.tensor_params and not superpixels.is_spec(value)  # drawn later
        if tensor and value is not None and not isinstance(value, (int, float)):
            if isinstance(value, list) and value and any(map(codec.is_tensor_object, value)):
                value = tuple(
                    codec.decode_tensor(v, (*loc, i), settings.max_tensor_elements)
                    for i, v in enumerate(value)
                )
            else:
                value = codec.decode_tensor(value, loc, settings.max_tensor_elements)
        out[name] = value
    return out


def validate_params(ms: MethodSpec, raw: dict[str, Any]) -> MethodParams:
    """The method's params model over the request's params: coerced, defaults filled in."""
    try:
        return parse_params(ms.params, ms.name, raw)
    except AttributionError as exc:
        raise from_engine(exc) from None


def given(p: MethodParams) -> dict[str, Any]:
    """The validated values of the params a request gave (what the worker passes on)."""
    return {name: getattr(p, name) for name in p.model_fields_set}


#: params this server caps, and which limit (``Settings.max_n_steps``/``max_n_samples``) each
#: counts against
LIMITS: Mapping[str, str] = MappingProxyType({"n_steps": "steps", "n_samples": "samples"})


def limits(ms: MethodSpec) -> dict[str, str]:
    """The limited params of ``ms`` and the limit each counts against."""
    return {f: k for f, k in LIMITS.items() if f in ms.params.model_fields}


def limit_value(ms: MethodSpec, p: MethodParams, name: str) -> int | None:
    """The value of the limited param ``name`` that counts against its limit: the int given,
    or the most ``n_steps="auto"`` may take; None if unset."""
    value = getattr(p, name, None)
    if name == "n_steps" and value == "auto" and ms.auto_steps is not None:
        return int(ms.auto_steps(p))
    if name == "n_samples" and value == "auto" and ms.auto_samples is not None:
        return ms.auto_samples
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def check_limits(ms: MethodSpec, p: MethodParams, settings: Settings) -> None:
    """Step and sample limits, on the values after coercion (n_steps="auto": its ladder top)."""
    caps = {"steps": settings.max_n_steps, "samples": settings.max_n_samples}
    for name, kind in limits(ms).items():
        value = limit_value(ms, p, name)
        if value is not None and value > caps[kind]:
            given = getattr(p, name)
            unit = "steps" if kind == "steps" else "samples"
            shown = f"{given!r} (up to {value} {unit})" if given != value else str(value)
            raise LimitExceeded(
                f"{name} {shown} is over this server's limit of {caps[kind]}",
                loc=("body", "params", name),
            )


def noise_tunnel(raw: dict[str, Any] | None, settings: Settings) -> dict[str, Any] | None:
    """The request's noise tunnel, validated and within the sample limit."""
    if raw is None:
        return None
    try:
        nt = parse_noise_tunnel(raw)
    except AttributionError as exc:
        raise from_engine(exc) from None
    if nt.nt_samples > settings.max_n_samples:
        raise LimitExceeded(
            f"nt_samples {nt.nt_samples} is over this server's limit of {settings.max_n_samples}",
            loc=("body", "noise_tunnel", "nt_samples"),
        )
    return {name: getattr(nt, name) for name in nt.model_fields_set}


def check_texts(texts: tuple[str | tuple[str, str], ...], settings: Settings) -> int:
    """Per-text token cap before any work (each word is at least one token); the longest."""
    longest = 0
    cap = settings.max_text_tokens
    for i, item in enumerate(texts):
        text = item if isinstance(item, str) else " ".join(item)  # a pair: both its texts
        words = len(text.split())
        if words > cap or len(text) > cap * MAX_CHARS_PER_TOKEN:
            raise LimitExceeded(
                f"text {i} is {len(text)} characters ({words} words); this server takes at most "
                f"{cap} tokens per text",
                loc=("body", "inputs", i),
            )
        longest = max(longest, words)
    return max(1, longest)


def batch_size(
    name: str,
    requested: int | str | None,
    model_default: int | str | None,
    server_default: int | str | None,
    cap: int,
) -> int | str | None:
    """``internal_batch_size`` / ``perturbations_per_eval``: the request's (within the cap),
    else the model's, else the server's."""
    if isinstance(requested, int) and requested > cap:
        raise LimitExceeded(
            f"{name} {requested} is over the server's cap {cap}", loc=("body", name)
        )
    if requested is not None:
        return requested
    return model_default if model_default is not None else server_default


def check_cost(
    est: int, n: int, rows: int, settings: Settings, ms: MethodSpec, p: MethodParams
) -> None:
    """The request's estimated forward rows within the server's limit; the refusal says what
    would bring it down (a feature mask, for methods whose cost grows with the features)."""
    if est <= settings.max_cost:
        return
    fix = "send fewer examples, steps or samples"
    if "feature_mask" in ms.params.model_fields and getattr(p, "feature_mask", None) is None:
        fix = (
            "group the features with params.feature_mask (the cost grows with the number of "
            "features, or groups, evaluated), or " + fix
        )
    raise LimitExceeded(
        f"this request would cost about {est} forward rows ({n} examples x {rows}); "
        f"the limit is {settings.max_cost}: {fix}",
        loc=("body",),
    )


def precision(spec: ModelSpec, req: AttributionRequest) -> str | None:
    """The dtype the model runs in: the request's, else the model's default; None: the
    model's own dtype (so is a precision equal to it)."""
    chosen = req.precision if req.precision is not None else spec.precision
    if chosen is not None and spec.remote is not None:
        raise InvalidRequest(
            f"model {spec.id!r} is served by the {spec.remote.describe()}, which computes "
            "in its own dtype; omit precision",
            loc=("body", "precision"),
        )
    return None if chosen == spec.dtype else chosen


def sampled(settings: Settings, spec: ModelSpec, precision: str | None) -> bool:
    """Whether an answer in ``precision`` is one of the share checked against float32
    unasked (models.toml ``fidelity_sample``, else ``ATTRSERVE_VERIFY_SHARE``); never one in
    the model's own dtype (``precision`` None)."""
    share = settings.verify_share if spec.fidelity_sample is None else spec.fidelity_sample
    return precision is not None and random.random() < share
