"""The command's options as an attributions request, and its messages to the user."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from service.core.errors import InvalidRequest, ServiceError

PROG = "attrserve attribute"


def say(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def _where(err: ServiceError) -> str:
    if not err.errors:
        return ""
    loc = [str(p) for p in err.errors[0].get("loc", [])]
    loc = loc[1:] if loc[:1] == ["body"] else loc
    return ".".join(loc)


def describe(err: ServiceError, examples: tuple[int, int] | None = None) -> str:
    """An error for a person: the HTTP API's detail, where, and which examples."""
    at = [f"at {w}"] if (w := _where(err)) else []
    if examples is not None:
        at.append(f"examples {examples[0]}..{examples[1] - 1}")
    return err.detail + (f" ({', '.join(at)})" if at else "")


def _json_option(name: str, text: str | None, kind: type | None = None) -> Any:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"{name} is not valid JSON: {exc}") from None
    if kind is not None and not isinstance(value, kind):
        raise InvalidRequest(f"{name} must be a JSON {kind.__name__}, got {text!r}")
    return value


def parse_target(text: str | None) -> Any:
    """``--target``: JSON when it parses (3, [1, 0], {"index": [2]}, null), else a label."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The attributions request's fields (all but ``inputs`` and ``baselines``) from the
    command's options; a ``--target`` list (one per example of the file) is left to the
    examples, so ``target`` is then None. InvalidRequest for options that do not parse."""
    target = parse_target(args.target)
    return {
        "method": args.method,
        "target": None if isinstance(target, list) else target,
        "params": _json_option("--params", args.params, dict) or {},
        "noise_tunnel": _json_option("--noise-tunnel", args.noise_tunnel, dict),
        "internal_batch_size": _batch_knob("--internal-batch-size", args.internal_batch_size),
        "perturbations_per_eval": _batch_knob(
            "--perturbations-per-eval", args.perturbations_per_eval
        ),
        "seed": args.seed,
        "return_convergence_delta": args.convergence_delta,
    }


def _batch_knob(name: str, text: str | None) -> int | str | None:
    if text is None or text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{name} must be an int or 'auto', got {text!r}") from None
